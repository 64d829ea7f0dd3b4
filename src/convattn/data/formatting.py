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
import shutil
from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerBase

from convattn.errors import UsageError

FORMATS = ("pairs", "packed")
FORMAT_VERSION = 1
COLUMNS = ["input_ids", "token_type_ids", "special_tokens_mask"]


def _pair_lines(batch: dict, tokenizer: PreTrainedTokenizerBase, seq_len: int) -> dict:
    lines = batch["text"]
    n_pairs = len(lines) // 2
    options = dict(max_length=seq_len, return_token_type_ids=True, return_special_tokens_mask=True)
    rows: dict[str, list] = {column: [] for column in COLUMNS}
    if n_pairs:  # a batch of one line has no pair (the tokenizer fails on empty lists)
        encoded = tokenizer(lines[0:2 * n_pairs:2], lines[1:2 * n_pairs:2], truncation="longest_first", **options)
        rows = {column: list(encoded[column]) for column in COLUMNS}
    if len(lines) % 2:  # the odd line out at the end of the batch stands alone
        single = tokenizer(lines[-1], truncation=True, **options)
        for column in COLUMNS:
            rows[column].append(single[column])
    return rows


def _pack_blocks(batch: dict, tokenizer: PreTrainedTokenizerBase, seq_len: int) -> dict:
    ids = [token for row in tokenizer(batch["text"], add_special_tokens=False)["input_ids"] for token in row]
    width = seq_len - 2
    blocks = [[tokenizer.cls_token_id, *ids[i:i + width], tokenizer.sep_token_id]
              for i in range(0, len(ids) - width + 1, width)]
    return {
        "input_ids": blocks,
        "token_type_ids": [[0] * seq_len for _ in blocks],
        "special_tokens_mask": [[1] + [0] * width + [1] for _ in blocks],
    }


def format_dataset(texts: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, layout: str, seq_len: int,
                   num_proc: int | None = None) -> datasets.Dataset:
    if layout not in FORMATS:
        raise UsageError(f"--format {layout!r} is not known; choose one of {', '.join(FORMATS)}")
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
        raise UsageError("the tokenizer has no [CLS]/[SEP] tokens; use one trained by convattn or a BERT-style one")
    function = _pair_lines if layout == "pairs" else _pack_blocks
    # packed blocks span lines, so a bigger batch wastes less at its end
    return texts.map(function, batched=True, batch_size=2000 if layout == "pairs" else 20000,
                     fn_kwargs={"tokenizer": tokenizer, "seq_len": seq_len}, remove_columns=texts.column_names,
                     num_proc=num_proc, desc=f"formatting ({layout}, {seq_len} tokens)")


def cache_key(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, (*parts, f"v{FORMAT_VERSION}"))).encode()).hexdigest()[:20]


def cached_format(texts: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, layout: str, seq_len: int,
                  directory: Path, num_proc: int | None = None) -> datasets.Dataset:
    """`format_dataset`, saved under `directory` (written once, atomically) and memory-mapped from there."""
    if not (directory / "dataset_info.json").exists():
        formatted = format_dataset(texts, tokenizer, layout, seq_len, num_proc)
        if len(formatted) == 0:
            raise UsageError(
                f"the corpus gives no {seq_len}-token {layout} examples; give more text or a smaller --seq-len"
            )
        tmp = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        formatted.save_to_disk(str(tmp))
        shutil.rmtree(directory, ignore_errors=True)
        tmp.replace(directory)
    return datasets.load_from_disk(str(directory))
