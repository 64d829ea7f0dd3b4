"""Padding-free batches for convattn models: the examples of a batch end to end in one row.

The layout is transformers' `DataCollatorWithFlattening`: input_ids (1, total) and position_ids restarting at 0
at every example, which convattn models read as sequence boundaries (the rule:
`convattn.flattened_inputs.flattened_sequences`): each example is computed as if it were alone, its relative
terms and convolutions stopping at its ends. What transformers' collator leaves out and convattn's examples carry
is kept here:

* token_type_ids (sentence pairs), flattened the same way (0s for examples without them);
* MLM masking (`masking`, a `DataCollatorForLanguageModeling`) applied to the flattened row, with the same
  statistics as on a padded batch: every token is masked with the same probability, special tokens never;
* one label per example ("label" or "labels" a number): labels (batch,), which a sequence classifier matches to
  each example's first token; token-level labels (lists) are flattened with the tokens.

Linformer models take padded batches only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DataCollatorForLanguageModeling

FLATTENED_KEYS = ("input_ids", "token_type_ids", "special_tokens_mask")
LABEL_KEYS = ("labels", "label")


def as_list(values) -> list:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def example_label(example: dict):
    return next((example[key] for key in LABEL_KEYS if key in example), None)


def is_token_level(label) -> bool:
    return isinstance(label, Sequence) or (hasattr(label, "ndim") and label.ndim > 0)


@dataclass
class FlatteningCollator:
    """features (dicts of input_ids and optionally token_type_ids, special_tokens_mask, a label) -> one flattened
    row: input_ids, position_ids, token_type_ids (1, total), labels; with return_flash_attn_kwargs also
    cu_seq_lens_q / cu_seq_lens_k (batch + 1,) int32 and max_length_q / max_length_k, as transformers' collator.
    `masking`: MLM masking of the row (its generator, when set, makes masks reproducible).
    `return_special_tokens_mask`: the examples' special_tokens_mask flattened too (1, total), for a model that masks
    itself (ELECTRA's ConvAttnForPreTraining) and must leave [CLS] and [SEP] alone.

    Examples may differ in what they carry: those without token_type_ids get 0s (a single segment) when others
    have them, those without a special_tokens_mask get the tokenizer's when masking needs one. Labels come with
    every example or none, token-level ones one per token. Empty examples are dropped, as transformers' collator
    does; padded ones (an attention_mask with 0s) are refused, their pads would become tokens."""

    masking: DataCollatorForLanguageModeling | None = None
    return_flash_attn_kwargs: bool = False
    return_special_tokens_mask: bool = False

    def __post_init__(self):
        if self.masking is not None and not getattr(self.masking, "mlm", True):
            raise ValueError("masking: the DataCollatorForLanguageModeling has mlm=False (causal LM labels, no "
                             "masking), but masking here is MLM masking; give one with mlm=True, or leave masking out")

    def __call__(self, features: Sequence[dict]) -> dict:
        for index, feature in enumerate(features):
            check_example(index, feature)
        features = [f for f in features if len(f["input_ids"]) > 0]
        if not features:
            raise ValueError("FlatteningCollator received a batch where every example is empty")
        token_types = any("token_type_ids" in f for f in features)
        columns = [self.example_columns(i, f, token_types) for i, f in enumerate(features)]
        lengths = [len(c["input_ids"]) for c in columns]
        batch = {
            key: torch.tensor([t for c in columns for t in c[key]], dtype=torch.long)[None]
            for key in FLATTENED_KEYS
            if key in columns[0]
        }
        batch["position_ids"] = torch.cat([torch.arange(length) for length in lengths])[None]
        labels = flattened_labels(features, lengths)
        if labels is not None:
            batch["labels"] = labels
        special = batch["special_tokens_mask"] if self.return_special_tokens_mask else \
            batch.pop("special_tokens_mask", None)
        if self.masking is not None:
            if "labels" in batch:
                raise ValueError("examples with labels cannot be masked for MLM: masking makes the labels")
            batch["input_ids"], batch["labels"] = self.masking.torch_mask_tokens(batch["input_ids"], special)
        if self.return_flash_attn_kwargs:
            cu_seq_lens = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
            batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = cu_seq_lens
            batch["max_length_q"] = batch["max_length_k"] = max(lengths)
        return batch

    def example_columns(self, index: int, example: dict, token_types: bool) -> dict:
        """An example's per-token lists, every one as long as its input_ids, the ones other examples may carry
        filled in (`FlatteningCollator`)."""
        ids = as_list(example["input_ids"])
        if "attention_mask" in example and not all(as_list(example["attention_mask"])):
            raise ValueError(f"example {index} is padded (its attention_mask holds 0s): flattening would make its "
                             "pads tokens; give the examples unpadded")
        columns = {"input_ids": ids}
        if token_types:
            columns["token_type_ids"] = as_list(example.get("token_type_ids", [0] * len(ids)))
        if self.masking is not None or self.return_special_tokens_mask:  # what masking must leave alone
            special = example.get("special_tokens_mask")
            if special is None and self.masking is None:
                raise ValueError(f"example {index} has no special_tokens_mask, which return_special_tokens_mask "
                                 "passes on; tokenize with return_special_tokens_mask=True")
            if special is None:
                special = self.masking.tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True)
            columns["special_tokens_mask"] = as_list(special)
        for key, values in columns.items():
            if len(values) != len(ids):
                raise ValueError(f"{key} of example {index} has {len(values)} entries for its {len(ids)} input_ids")
        return columns


def check_example(index: int, example: dict) -> None:
    """An example the collator can read: token ids (not embeddings), one sequence each (not a batch of one, as
    `tokenizer(..., return_tensors="pt")` gives), and a label that is a number or numbers (not a class name)."""
    if "input_ids" not in example:
        carried = ", ".join(sorted(example)) or "nothing"
        raise ValueError(f"example {index} has no input_ids (it carries {carried}): FlatteningCollator flattens "
                         "token ids; tokenize the text (inputs_embeds cannot be flattened: pass them to the model "
                         "padded, with an attention_mask)")
    for key in (*FLATTENED_KEYS, "attention_mask", *LABEL_KEYS):
        value = example.get(key)
        nested = isinstance(value, list | tuple) and len(value) > 0 and isinstance(value[0], list | tuple)
        if (hasattr(value, "ndim") and value.ndim > 1) or nested:
            shape = tuple(value.shape) if hasattr(value, "shape") else (len(value), len(value[0]))
            raise ValueError(f"{key} of example {index} has shape {shape}, a batch, not one example: "
                             "tokenize without return_tensors=\"pt\" (the collator makes the batch), or give each "
                             "row as its own example")
    label = example_label(example)
    if isinstance(label, str | bytes) or (is_token_level(label) and any(isinstance(t, str) for t in label)):
        raise ValueError(f"the label of example {index} is text ({label!r}), not a class number: map the names to "
                         "numbers first (e.g. the dataset's ClassLabel.str2int, or the model config's label2id)")


def flattened_labels(features: Sequence[dict], lengths: list[int]) -> torch.Tensor | None:
    """One label per example (batch,), or token-level labels (1, total) flattened with the tokens; None if no
    example carries one."""
    labels = [example_label(f) for f in features]
    carried = sum(label is not None for label in labels)
    if carried == 0:
        return None
    if carried < len(labels):
        raise ValueError(f"labels: {carried} of {len(labels)} examples carry one ('labels' or 'label'); every "
                         "example or none")
    token_level = [is_token_level(label) for label in labels]
    if any(token_level) != all(token_level):
        raise ValueError("labels: some examples carry one per token, others one per example; one kind per batch")
    if not all(token_level):
        return torch.tensor([label.item() if hasattr(label, "item") else label for label in labels])
    for index, (label, length) in enumerate(zip(labels, lengths, strict=True)):
        if len(label) != length:
            raise ValueError(f"labels of example {index} has {len(label)} entries for its {length} input_ids")
    return torch.tensor([t for label in labels for t in as_list(label)], dtype=torch.long)[None]
