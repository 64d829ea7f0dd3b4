"""Local text is cached by its content: a file edited in place, to the same size and modification time, is read
again (a key of path, size and time served the old text to a new run and to a resumed one), and the same text
anywhere shares one entry. An empty $CONVATTN_CACHE means the default cache, not the working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from convattn.data.corpus import local_corpus


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def rewrite_keeping_size_and_times(path: Path, text: str) -> None:
    before = os.stat(path)
    assert len(text.encode()) == before.st_size
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns


EDITS = [  # (file edited, its new text: same size)
    ("train.txt", "alpha beta gamma\nalpha beta delta\n" * 20),
    ("valid.txt", "eval lines here\nsome more text!\n"),
]


@pytest.mark.parametrize(("edited", "text"), EDITS, ids=["train", "eval"])
def test_a_file_edited_to_the_same_size_and_time_is_read_again(tmp_path, edited, text):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("alpha beta gamma\nalpha beta gamma\n" * 20)
    (corpus / "valid.txt").write_text("eval lines here\nsome more text.\n")
    files = [str(corpus / "train.txt")], [str(corpus / "valid.txt")]
    first = local_corpus(*files, tmp_path / "cache")
    rewrite_keeping_size_and_times(corpus / edited, text)
    again = local_corpus(*files, tmp_path / "cache")
    assert again.identity != first.identity
    read = again.train if edited == "train.txt" else again.eval
    assert "\n".join(read["text"]) + "\n" == text


def test_the_same_text_elsewhere_has_the_same_identity(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "text.txt").write_text("one line of text\nanother line\n" * 10)
    here, there = (local_corpus([str(tmp_path / f / "text.txt")], [], tmp_path / "cache") for f in ("a", "b"))
    assert here.identity == there.identity


@pytest.mark.parametrize(("value", "expected"), [
    (None, ".cache/convattn"), ("", ".cache/convattn"), ("~/elsewhere", "elsewhere"), ("/abs/cache", "/abs/cache"),
])
def test_convattn_cache_unset_or_empty_is_the_default(monkeypatch, tmp_path, value, expected):
    from convattn.training.pretrain import default_cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    if value is None:
        monkeypatch.delenv("CONVATTN_CACHE", raising=False)
    else:
        monkeypatch.setenv("CONVATTN_CACHE", value)
    assert default_cache_dir() == tmp_path / expected


def word_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer of the tiny corpus's words, saved in `folder`: it splits that text otherwise than the
    unigram tokenizer a run trains on it."""
    from helpers.pretrain import WORDS
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    backend = Tokenizer(models.WordLevel({token: i for i, token in enumerate(specials + WORDS)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]").save_pretrained(str(folder))
    return folder


def test_formatted_examples_are_cached_by_everything_that_makes_them(tmp_path):
    """One cache, one corpus: another sequence length, layout or tokenizer formats the text again (an entry keyed by
    less would serve another run's examples)."""
    from helpers.pretrain import write_corpus

    from convattn.training.pretrain.data import prepare_data
    from convattn.training.pretrain.resolve import resolve_options

    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus")

    def prepared(training: dict, **data):
        options = resolve_options(output_dir=tmp_path / "run", preset="chang2021-small/absolute",
                                  training={"seq_len": 32, **training},
                                  data={"train_files": [str(corpus / "train.txt")],
                                        "eval_files": [str(corpus / "valid.txt")], "cache_dir": tmp_path / "cache",
                                        **data})
        return prepare_data(options, options.recipe.seq_len, None).train["input_ids"]

    pairs = prepared({"vocab_size": 150})
    assert max(map(len, pairs)) == 32 and min(map(len, pairs)) < 32  # pairs of lines, truncated
    assert max(map(len, prepared({"vocab_size": 150, "seq_len": 48}))) == 48
    packed = prepared({"vocab_size": 150, "format": "packed"})
    assert set(map(len, packed)) == {32} and len(packed) != len(pairs)  # the text in full blocks
    words = prepared({}, tokenizer=str(word_tokenizer(tmp_path / "words")))
    assert len(words[0]) < len(pairs[0])  # a word a token, where the unigram pieces of this text are letters


def test_a_tokenizer_is_cached_by_the_text_it_was_trained_on(tmp_path):
    import datasets

    from convattn.data.tokenizer import tokenizer_fingerprint, trained_tokenizer

    def trained(text: str, identity: str):
        rows = datasets.Dataset.from_dict({"text": [text] * 50})
        return trained_tokenizer(rows, identity, 200, 32, tmp_path / "cache")

    first = trained("the cat sat on the mat with a hat", "files[a]")
    other = trained("quick brown foxes jump over lazy dogs", "files[b]")
    assert tokenizer_fingerprint(first) != tokenizer_fingerprint(other)  # the same size, another text
    assert "q" in other.get_vocab() and "q" not in first.get_vocab()  # each of its own text's pieces


def test_the_same_files_in_another_order_are_another_text(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(f"the lines of {name}\n" * 10)
    forward = local_corpus([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], [], tmp_path / "cache")
    backward = local_corpus([str(tmp_path / "b.txt"), str(tmp_path / "a.txt")], [], tmp_path / "cache")
    assert forward.identity != backward.identity  # it keys the formatted examples, whose order follows the files'
    assert forward.train["text"][0] == "the lines of a.txt" and backward.train["text"][0] == "the lines of b.txt"
