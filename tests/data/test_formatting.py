"""Sentence-pair lines and packed blocks, cached on disk and memory-mapped."""

from __future__ import annotations

import copy
import random

import datasets
import pytest
from helpers.tiny import tiny_wordpiece_tokenizer

import convattn.data.formatting as formatting
from convattn.data.cache import entry_problem
from convattn.data.formatting import FORMATS, cache_key, cached_format, format_dataset
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
    assert out["special_tokens_mask"] == [[1] + [0] * 14 + [1]] * len(out)
    assert out["token_type_ids"] == [[0] * 16] * len(out)  # one segment: the model adds token type 0's embedding


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


def test_the_odd_line_out_is_truncated_to_seq_len_too(tokenizer):
    """The last line of an odd batch is encoded alone: a long one is cut to seq_len as a pair is, not kept whole
    (a longer example than the model's positions, or than the sequence length its results are reported for)."""
    long = " ".join(WORDS * 10)
    out = format_dataset(lines("alpha beta", "gamma delta", long), tokenizer, "pairs", 16)
    assert out[-1]["input_ids"] == tokenizer(long, truncation=True, max_length=16)["input_ids"]
    assert len(out[-1]["input_ids"]) == 16 and out[-1]["special_tokens_mask"] == [1] + [0] * 14 + [1]


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


def test_a_long_line_of_long_words_keeps_every_token_truncation_keeps():
    """A text of a pair is cut to 16 characters a token before tokenizing: a line of 15-character words that are
    one token each (the most characters a token the cut allows for) beside a short line keeps every token the
    tokenizer's own truncation keeps of it."""
    long_words = "internationally understandings representations convolutional transformations".split()  # noqa: SIM905
    wordy = tiny_wordpiece_tokenizer([" ".join(long_words), "alpha beta"] * 20, vocab_size=300)
    long = " ".join(long_words[i % len(long_words)] for i in range(200))
    assert len(wordy.tokenize(long)) == 200
    out = format_dataset(lines("alpha", long), wordy, "pairs", 32)
    assert out[0]["input_ids"] == wordy("alpha", long, truncation="longest_first", max_length=32)["input_ids"]


def chunks_by_hand(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of `lengths`, grouped in order: an item joins the group before it while the group stays within
    `budget`."""
    groups: list[list[int]] = []
    for index, length in enumerate(lengths):
        if groups and sum(lengths[i] for i in groups[-1]) + length <= budget:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


@pytest.mark.parametrize("seed", range(20))
def test_texts_are_tokenized_in_order_in_the_fullest_chunks_within_the_budget(seed):
    """Every text once, in order, in slices as full as the budget allows (an item longer than the budget alone):
    the tokenizer's memory is bounded without calling it more often than needed."""
    rng = random.Random(seed)
    budget = rng.randint(1, 30)
    lengths = [rng.choice([0, 1, budget // 2, budget, budget + 1, rng.randint(0, 2 * budget)])
               for _ in range(rng.randint(0, 25))]
    chunks = [list(range(len(lengths)))[part] for part in formatting._chunks(lengths, budget)]
    assert chunks == chunks_by_hand(lengths, budget)


@pytest.mark.parametrize(("text", "expected"), [
    ("a" * 20, "a" * 20),
    ("a" * 12 + " " + "b" * 7, "a" * 12 + " " + "b" * 7),  # exactly the limit: kept whole
    ("a" * 12 + " " + "b" * 8, "a" * 12),
    ("a" * 10 + " " + "b" * 15, "a" * 10),
    ("a" * 5 + " " + "b" * 15, "a" * 5 + " " + "b" * 14),  # its only space too early: cut at the limit
    ("a" * 20 + " " + "b", "a" * 20),
])
def test_a_text_is_cut_past_the_limit_at_its_last_space_in_the_second_half(text, expected):
    """Each text of a pair is cut to `limit` characters (20 here) before tokenizing; within the limit it is kept
    whole, and a cut falls at a space so no word is split into other pieces."""
    assert formatting._prefix(text, 20) == expected


def test_a_tokenizer_without_cls_or_sep_is_refused(tokenizer):
    """Every example is [CLS] ... [SEP]: a tokenizer lacking one of them would format pairs with ids that are not
    the model's [CLS] or [SEP]."""
    for token in ("cls_token", "sep_token"):
        lacking = copy.deepcopy(tokenizer)
        setattr(lacking, token, None)
        for layout in FORMATS:
            with pytest.raises(UsageError, match=r"the tokenizer has no \[CLS\]/\[SEP\] tokens"):
                format_dataset(lines("alpha beta", "gamma delta"), lacking, layout, 16)


def test_an_unknown_layout_is_refused_not_formatted_as_another(tokenizer):
    with pytest.raises(UsageError, match=r"`format` 'pair' is not known; choose one of pairs, packed"):
        format_dataset(lines("alpha beta", "gamma delta"), tokenizer, "pair", 16)


def test_the_cache_key_changes_with_every_part_and_the_format_version(monkeypatch):
    """Formatted data is found again by this key: data of another corpus, tokenizer, layout or sequence length, or
    formatted by an older version of this module, is never reused."""
    parts = ("corpus-a", "tokenizer-a", "pairs", 128)
    changed = [(*parts[:i], other, *parts[i + 1:]) for i, other in enumerate(("corpus-b", "tokenizer-b", "packed",
                                                                               512))]
    keys = [cache_key(*parts), *(cache_key(*p) for p in changed)]
    assert cache_key(*parts) == keys[0] and len(set(keys)) == len(keys)
    monkeypatch.setattr(formatting, "FORMAT_VERSION", formatting.FORMAT_VERSION + 1)
    assert cache_key(*parts) not in keys
