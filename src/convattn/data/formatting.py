"""Turn lines of text into model inputs, cached on disk (memory-mapped) by a fingerprint.

Two layouts:

* `pairs` (Chang et al. 2021): consecutive non-empty lines become `[CLS] a [SEP] b [SEP]`, token types
  0 / 1, truncated to `seq_len` (no next-sentence prediction);
* `packed` (Conv-Linformer, fairseq style): all tokens concatenated and cut into full blocks of
  `[CLS] ... [SEP]` of exactly `seq_len` tokens.

Rows carry `input_ids`, `token_type_ids`, `special_tokens_mask`; the collator pads and masks them.
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from convattn.data.cache import cache_entry
from convattn.errors import UsageError, option

FORMATS = ("pairs", "packed")
FORMAT_VERSION = 1
COLUMNS = ["input_ids", "token_type_ids", "special_tokens_mask"]
# a text of a pair is cut to this many characters per token of the sequence before it is tokenized: the tokens
# truncation keeps lie well within (real text averages under 10 characters a token), so the examples are the
# same, but where a cut turns which text of the pair is the longer in tokens: longest_first then gives the odd
# free slot to the other text, one token (pairs with a text cut: 0.14 % of the enwiki sample's at seq_len 128)
PAIR_CHARS_PER_TOKEN = 16
PAIR_TOKEN_SLOTS = 50_000  # pair tokens (overflowing pieces included) the fast tokenizer holds at once
TOKENIZER_CHARS = 1_000_000  # text given to the fast tokenizer at once (it holds offsets and strings per token)


def _chunks(lengths: list[int], budget: int) -> Iterator[slice]:
    """Consecutive slices of items whose lengths add up to at most `budget` (or one item longer than that)."""
    start = total = 0
    for i, length in enumerate(lengths):
        if i > start and total + length > budget:
            yield slice(start, i)
            start, total = i, 0
        total += length
    if start < len(lengths):
        yield slice(start, len(lengths))


def _prefix(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, at its last whitespace before the limit if it has one there."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", limit // 2, limit)
    return text[:cut if cut > 0 else limit]


def _pair_lines(batch: dict, tokenizer: PreTrainedTokenizerBase, seq_len: int) -> dict:
    # the fast tokenizer truncates a pair by keeping every combination of the two texts' overflowing pieces (their
    # product: two 100,000-token lines took 23 GB), so each text is first cut to what can reach the kept tokens
    limit = PAIR_CHARS_PER_TOKEN * seq_len
    lines = [_prefix(text, limit) for text in batch["text"]]
    firsts, seconds = lines[0:len(lines) - 1:2], lines[1::2]
    options = dict(max_length=seq_len, return_token_type_ids=True, return_special_tokens_mask=True)
    rows: dict[str, list] = {column: [] for column in COLUMNS}
    # a pair is encoded whole before truncation, with the product of its texts' overflowing pieces: a bounded
    # number of those at a time bounds the tokenizer's memory (a character is at most a token, and longest_first
    # cuts two long texts into pieces of half the tokens the special ones leave)
    piece = max(1, (seq_len - tokenizer.num_special_tokens_to_add(pair=True)) // 2)
    costs = [(len(a) // piece + 1) * (len(b) // piece + 1) * seq_len for a, b in zip(firsts, seconds, strict=True)]
    for part in _chunks(costs, PAIR_TOKEN_SLOTS):
        encoded = tokenizer(firsts[part], seconds[part], truncation="longest_first", **options)
        for column in COLUMNS:
            rows[column].extend(encoded[column])
    if len(lines) % 2:  # the odd line out at the end of the batch stands alone
        single = tokenizer(lines[-1], truncation=True, **options)
        for column in COLUMNS:
            rows[column].append(single[column])
    return rows


def _token_stream(texts: list[str], tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """The tokens of `texts`, concatenated (no special tokens), tokenized a bounded slice of text at a time."""
    parts = [np.fromiter(itertools.chain.from_iterable(
                 tokenizer(texts[part], add_special_tokens=False, return_attention_mask=False,
                           return_token_type_ids=False)["input_ids"]), dtype=np.int32)
             for part in _chunks(list(map(len, texts)), TOKENIZER_CHARS)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def _pack_blocks(batch: dict, tokenizer: PreTrainedTokenizerBase, seq_len: int) -> dict:
    ids = _token_stream(batch["text"], tokenizer)
    width = seq_len - 2
    n_blocks = len(ids) // width
    if n_blocks == 0:
        return {column: [] for column in COLUMNS}
    body = ids[:n_blocks * width].reshape(n_blocks, width)
    blocks = np.concatenate([np.full((n_blocks, 1), tokenizer.cls_token_id, dtype=np.int32), body,
                             np.full((n_blocks, 1), tokenizer.sep_token_id, dtype=np.int32)], axis=1)
    # the types that datasets stores these columns in anyway
    return {
        "input_ids": blocks,
        "token_type_ids": np.zeros(blocks.shape, dtype=np.int8),
        "special_tokens_mask": np.tile(np.array([1] + [0] * width + [1], dtype=np.int8), (n_blocks, 1)),
    }


def format_dataset(texts: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, layout: str, seq_len: int,
                   num_proc: int | None = None, cache_file_name: str | None = None) -> datasets.Dataset:
    if layout not in FORMATS:
        raise UsageError(f"{option('format')} {layout!r} is not known; choose one of {', '.join(FORMATS)}")
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
        raise UsageError("the tokenizer has no [CLS]/[SEP] tokens; use one trained by convattn or a BERT-style one")
    function = _pair_lines if layout == "pairs" else _pack_blocks
    # packed blocks span lines, so a bigger batch wastes less at its end
    return texts.map(function, batched=True, batch_size=2000 if layout == "pairs" else 20000,
                     fn_kwargs={"tokenizer": tokenizer, "seq_len": seq_len}, remove_columns=texts.column_names,
                     num_proc=num_proc, cache_file_name=cache_file_name,
                     desc=f"formatting ({layout}, {seq_len} tokens)")


def cache_key(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, (*parts, f"v{FORMAT_VERSION}"))).encode()).hexdigest()[:20]


def cached_format(texts: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, layout: str, seq_len: int,
                  directory: Path, num_proc: int | None = None) -> datasets.Dataset:
    """`format_dataset`, saved under `directory` (a cache entry: written once, complete, checked on load) and
    memory-mapped from there."""

    def build(tmp: Path) -> None:
        # mapped into a scratch file of the entry (not the datasets cache), so the only copy is the checked one
        scratch = tmp / "scratch"
        scratch.mkdir()
        formatted = format_dataset(texts, tokenizer, layout, seq_len, num_proc, str(scratch / "mapped.arrow"))
        if len(formatted) == 0:
            raise UsageError(
                f"the corpus gives no {seq_len}-token {layout} examples; give more text or a smaller "
                f"{option('seq_len')}"
            )
        formatted.save_to_disk(str(tmp / "data"))
        del formatted
        shutil.rmtree(scratch)

    return datasets.load_from_disk(str(cache_entry(directory, build, f"{layout} data") / "data"))
