"""Unigram tokenizer: uncased, BERT special tokens, saves/loads with AutoTokenizer, cached per corpus."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import datasets
import pytest
from transformers import AutoTokenizer

from convattn.data.cache import entry_problem
from convattn.data.tokenizer import (
    SPECIAL_TOKENS,
    load_tokenizer,
    tokenizer_fingerprint,
    train_tokenizer,
    trained_tokenizer,
)
from convattn.errors import UsageError

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly bumpkins".split()  # noqa: SIM905


def texts(n: int = 400) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"text": [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12))
                                                for i in range(n)]})


def test_trained_tokenizer_is_uncased_with_bert_specials(tmp_path):
    tokenizer = train_tokenizer(texts(), vocab_size=120, max_length=64)
    assert len(tokenizer) <= 120
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tokenizer.pad_token_id == 0 and tokenizer.mask_token == "[MASK]"
    assert tokenizer("The QUICK Fox")["input_ids"] == tokenizer("the quick fox")["input_ids"]
    pair = tokenizer("quick fox", "lazy dog")
    tokens = tokenizer.convert_ids_to_tokens(pair["input_ids"])
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
    first_sep = tokens.index("[SEP]")
    assert pair["token_type_ids"] == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded("quick fox", "lazy dog")["input_ids"] == pair["input_ids"]
    assert load_tokenizer(tmp_path).mask_token_id == tokenizer.mask_token_id


def test_a_filled_in_mask_decodes_with_single_spaces(tmp_path):
    """[MASK] takes the space before it (no lone "▁" piece there), so fill-mask's sequences read as text."""
    tokenizer = train_tokenizer(texts(), vocab_size=120, max_length=64)
    tokenizer.save_pretrained(tmp_path)
    for loaded in (tokenizer, AutoTokenizer.from_pretrained(tmp_path)):
        ids = loaded("the quick [MASK] jumps")["input_ids"]
        tokens = loaded.convert_ids_to_tokens(ids)
        assert tokens[tokens.index("[MASK]") - 1] != "▁"
        word = loaded("brown", add_special_tokens=False)["input_ids"]  # the pieces a model would put there
        filled = ids[:ids.index(loaded.mask_token_id)] + word + ids[ids.index(loaded.mask_token_id) + 1:]
        assert loaded.decode(filled, skip_special_tokens=True) == "the quick brown jumps"


def test_vocabulary_must_exceed_the_special_tokens():
    with pytest.raises(UsageError, match="`vocab_size` 5"):
        train_tokenizer(texts(10), vocab_size=5, max_length=64)


def test_bad_tokenizer_directory(tmp_path):
    with pytest.raises(UsageError, match="no such directory"):
        load_tokenizer(tmp_path / "nope")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(UsageError, match="not a directory; give the directory a tokenizer was saved to"):
        load_tokenizer(tmp_path / "tokenizer.json")  # a file of it, not "no such directory"
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(UsageError, match="cannot load a tokenizer"):
        load_tokenizer(tmp_path)


def test_training_is_cached_per_corpus_and_size(tmp_path, monkeypatch):
    first = trained_tokenizer(texts(), "corpus-a", 100, 64, tmp_path)
    monkeypatch.setattr("convattn.data.tokenizer.train_tokenizer", lambda *a: pytest.fail("trained again"))
    second = trained_tokenizer(texts(), "corpus-a", 100, 64, tmp_path)
    assert second.get_vocab() == first.get_vocab()
    assert len([p for p in (tmp_path / "tokenizers").iterdir() if not p.name.startswith(".")]) == 1


def test_fingerprint_ignores_the_truncation_left_by_a_call():
    tokenizer = train_tokenizer(texts(), vocab_size=100, max_length=64)
    before = tokenizer_fingerprint(tokenizer)
    tokenizer(["quick fox"], truncation=True, max_length=8)
    assert tokenizer_fingerprint(tokenizer) == before


def test_a_damaged_cached_tokenizer_is_trained_again(tmp_path):
    trained_tokenizer(texts(), "corpus-a", 100, 64, tmp_path)
    (entry,) = (p for p in (tmp_path / "tokenizers").iterdir() if not p.name.startswith("."))
    (entry / "tokenizer.json").write_text("{}")
    again = trained_tokenizer(texts(), "corpus-a", 100, 64, tmp_path)
    assert again("quick fox")["input_ids"][0] == again.cls_token_id and entry_problem(entry) is None


def many_characters(n: int) -> datasets.Dataset:
    characters = [chr(0x4E00 + i) for i in range(n)]
    return datasets.Dataset.from_dict({"text": ["".join(characters[(i * 7 + j) % n] for j in range(40)) + " abc"
                                                for i in range(300)]})


@pytest.mark.parametrize("vocab_size", [100, 155])  # 155: the trainer accepts it, then overshoots the size
def test_a_vocabulary_smaller_than_the_alphabet_says_which_size_works(vocab_size):
    corpus = many_characters(150)  # 150 characters, plus "a", "b", "c" and the word boundary
    with pytest.raises(UsageError) as err:
        train_tokenizer(corpus, vocab_size=vocab_size, max_length=64)
    message = str(err.value)
    assert f"--vocab-size {vocab_size} is too small" in message and "154 distinct characters" in message
    assert "use --vocab-size 160 or more" in message and "\n" not in message
    assert len(train_tokenizer(corpus, vocab_size=160, max_length=64)) == 160


# trains a tokenizer on 30 MB of text (seconds) in a process of its own; prints "fitting" once the trainer runs
INTERRUPTED = textwrap.dedent("""
    import random, signal, subprocess, sys
    from pathlib import Path
    import datasets
    from convattn.data.tokenizer import trained_tokenizer

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # as the command line does
    # a shell without job control starts background jobs (CI scripts run with `&`) with SIGINT ignored, and
    # Python keeps it so: Ctrl-C's default handler, as in a terminal
    signal.signal(signal.SIGINT, signal.default_int_handler)
    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(20000)]
    texts = datasets.Dataset.from_dict({"text": [" ".join(rng.choices(words, k=30)) for _ in range(200000)]})
    start = subprocess.Popen

    def announced(*args, **kwargs):
        process = start(*args, **kwargs)
        print("fitting", flush=True)
        return process

    subprocess.Popen = announced
    trained_tokenizer(texts, "big", 8000, 128, Path(sys.argv[1]))
    print("finished", flush=True)
""")


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_during_training_stops_at_once_and_leaves_no_entry(tmp_path, signal_number):
    run = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(tmp_path)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert run.stdout.readline().strip() == "fitting", run.communicate()[1]
    time.sleep(0.5)
    run.send_signal(signal_number)
    stdout, stderr = run.communicate(timeout=60)  # a hang guard, not a speed bar (no wall time in tests)
    assert "finished" not in stdout and stderr.rstrip().endswith("KeyboardInterrupt")  # stopped mid-training
    assert "Exception ignored" not in stderr
    assert [p.name for p in (tmp_path / "tokenizers").iterdir() if not p.name.startswith(".")] == []
