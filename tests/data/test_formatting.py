"""Sentence-pair lines and packed blocks, cached on disk and memory-mapped."""

from __future__ import annotations

import random

import datasets
import pytest

import convattn.data.formatting as formatting
from convattn.data.cache import entry_problem
from convattn.data.formatting import cached_format, format_dataset
from convattn.data.tokenizer import train_tokenizer
from convattn.errors import UsageError

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()  # noqa: SIM905


@pytest.fixture(scope="module")
def tokenizer():
    lines = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(8)) for i in range(200)]
    return train_tokenizer(datasets.Dataset.from_dict({"text": lines}), vocab_size=80, max_length=512)


def lines(*texts: str) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"text": list(texts)})


def test_pairs_join_consecutive_lines(tokenizer):
    out = format_dataset(lines("alpha beta", "gamma delta", "epsilon"), tokenizer, "pairs", 32)
    assert len(out) == 2
    first = out[0]
    assert first["input_ids"] == tokenizer("alpha beta", "gamma delta")["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(first["input_ids"])
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2
    assert first["special_tokens_mask"] == [int(t in ("[CLS]", "[SEP]")) for t in tokens]
    assert set(first["token_type_ids"]) == {0, 1}
    assert out[1]["input_ids"] == tokenizer("epsilon")["input_ids"]  # the odd line out stands alone


def test_pairs_are_truncated_to_seq_len(tokenizer):
    long = " ".join(WORDS * 10)
    out = format_dataset(lines(long, long), tokenizer, "pairs", 16)
    assert len(out[0]["input_ids"]) == 16 and out[0]["input_ids"][-1] == tokenizer.sep_token_id


def test_packed_blocks_are_full_and_keep_token_order(tokenizer):
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(12)]
    out = format_dataset(lines(*texts), tokenizer, "packed", 16)
    stream = [t for text in texts for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
    assert len(out) == len(stream) // 14
    for i, block in enumerate(out["input_ids"]):
        assert len(block) == 16 and block[0] == tokenizer.cls_token_id and block[-1] == tokenizer.sep_token_id
        assert block[1:-1] == stream[i * 14:(i + 1) * 14]
    assert out[0]["special_tokens_mask"] == [1] + [0] * 14 + [1]


def test_cached_format_is_written_once_and_memory_mapped(tokenizer, tmp_path, monkeypatch):
    texts = lines(*[" ".join(WORDS)] * 50)
    first = cached_format(texts, tokenizer, "packed", 16, tmp_path / "key")
    monkeypatch.setattr("convattn.data.formatting.format_dataset", lambda *a: pytest.fail("formatted again"))
    second = cached_format(texts, tokenizer, "packed", 16, tmp_path / "key")
    assert second["input_ids"] == first["input_ids"]
    assert second.cache_files and second.cache_files[0]["filename"].startswith(str(tmp_path / "key"))


def test_too_little_text_for_one_block(tokenizer, tmp_path):
    with pytest.raises(UsageError, match="smaller `seq_len`"):
        cached_format(lines("alpha"), tokenizer, "packed", 64, tmp_path / "key")
    assert not (tmp_path / "key").exists()


@pytest.mark.parametrize("texts", [("alpha beta",), ("alpha beta", "gamma delta", "epsilon zeta")])
def test_pairs_of_an_odd_batch_keep_the_last_line_alone(tokenizer, texts):
    out = format_dataset(lines(*texts), tokenizer, "pairs", 32)
    assert len(out) == (len(texts) + 1) // 2
    assert out[-1]["input_ids"] == tokenizer(texts[-1])["input_ids"]


def test_a_corrupted_cached_arrow_file_is_detected_and_rebuilt(tokenizer, tmp_path, cache_log):
    texts = lines(*[" ".join(WORDS)] * 50)
    first = list(cached_format(texts, tokenizer, "packed", 16, tmp_path / "key")["input_ids"])
    (arrow,) = (tmp_path / "key").rglob("*.arrow")
    with open(arrow, "r+b") as f:  # random bytes in the middle of the file, its size unchanged
        f.seek(arrow.stat().st_size // 2)
        f.write(random.Random(0).randbytes(64))
    again = cached_format(texts, tokenizer, "packed", 16, tmp_path / "key")
    assert list(again["input_ids"]) == first and "rebuilding the cached packed data" in cache_log.text
    assert entry_problem(tmp_path / "key") is None


def test_formatting_leaves_no_copy_in_the_datasets_cache(tokenizer, tmp_path):
    source = tmp_path / "source"
    lines(*[" ".join(WORDS)] * 50).save_to_disk(str(source))
    texts = datasets.load_from_disk(str(source))
    cached_format(texts, tokenizer, "pairs", 16, tmp_path / "key")
    assert sorted(p.name for p in source.iterdir() if p.name.startswith("cache-")) == []


def test_a_pair_of_huge_lines_is_formatted_in_bounded_memory(tokenizer):
    """The fast tokenizer truncates a pair by keeping every combination of the texts' overflowing pieces (two
    100,000-token lines took 23 GB): each text is cut before, and the example is the one a short text gives."""
    huge = " ".join(WORDS[i % len(WORDS)] for i in range(100_000))
    out = format_dataset(lines(huge, huge), tokenizer, "pairs", 32)
    head = " ".join(WORDS[i % len(WORDS)] for i in range(100))
    expected = tokenizer(head, head, truncation="longest_first", max_length=32)["input_ids"]
    assert out[0]["input_ids"] == expected


def test_a_long_line_with_few_spaces_is_cut_where_it_keeps_every_token_truncation_keeps(tokenizer):
    """Each text of a pair is cut to 16 characters a token before tokenizing, at its last space in the second half
    of that limit: a line whose only space comes early (a long unbroken string after one word) keeps its string."""
    unbroken = "alpha " + "".join(WORDS) * 20  # one space, then 1,100 characters without one (the limit: 512)
    out = format_dataset(lines(unbroken, unbroken), tokenizer, "pairs", 32)
    expected = tokenizer(unbroken, unbroken, truncation="longest_first", max_length=32)["input_ids"]
    assert out[0]["input_ids"] == expected


class RecordingTokenizer:
    """The tokenizer, keeping the pairs of texts each call is given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.pair_calls = tokenizer, []

    def __call__(self, *texts, **options):
        if len(texts) == 2:
            self.pair_calls.append(list(zip(*texts, strict=True)))
        return self.tokenizer(*texts, **options)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


@pytest.mark.parametrize("seq_len", [6, 16, 64])
def test_pairs_go_to_the_tokenizer_a_bounded_number_of_overflowing_tokens_at_a_time(tokenizer, monkeypatch, seq_len):
    """The fast tokenizer holds every combination of a pair's overflowing pieces before it truncates (the 23 GB of
    two huge lines): the pairs of one call hold at most PAIR_TOKEN_SLOTS tokens (a single pair may hold more), and
    the rows are the ones each pair gives alone."""
    monkeypatch.setattr(formatting, "PAIR_TOKEN_SLOTS", 40 * seq_len)
    rng = random.Random(seq_len)
    words = " ".join(rng.choice(WORDS) for _ in range(4000))
    texts = [words[rng.randrange(100):][:rng.choice([1, 3, 10, 40, 16 * seq_len])].strip() or "mu" for _ in range(60)]
    recording = RecordingTokenizer(tokenizer)
    rows = formatting._pair_lines({"text": texts}, recording, seq_len)
    options = dict(truncation="longest_first", max_length=seq_len)
    for pairs in recording.pair_calls:
        held = [sum(map(len, tokenizer(a, b, return_overflowing_tokens=True, **options)["input_ids"]))
                for a, b in pairs]
        assert len(pairs) == 1 or sum(held) <= formatting.PAIR_TOKEN_SLOTS, (len(pairs), sum(held))
    assert len(recording.pair_calls) > 1
    assert rows["input_ids"] == [tokenizer(a, b, **options)["input_ids"] for a, b in zip(texts[::2], texts[1::2],
                                                                                          strict=True)]
