"""Padding-free batches for convattn models: the examples of a batch end to end in one row.

The layout is transformers' `DataCollatorWithFlattening`: input_ids (1, total) and position_ids restarting at 0
at every example, which convattn models read as sequence boundaries (`convattn.model.flattened_sequences`): each
example is computed as if it were alone, its relative terms and convolutions stopping at its ends. What
transformers' collator leaves out and convattn's examples carry is kept here:

* token_type_ids (sentence pairs), flattened the same way;
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


@dataclass
class FlatteningCollator:
    """features (dicts of input_ids and optionally token_type_ids, special_tokens_mask, a label) -> one flattened
    row: input_ids, position_ids, token_type_ids (1, total), labels; with return_flash_attn_kwargs also
    cu_seq_lens_q / cu_seq_lens_k (batch + 1,) int32 and max_length_q / max_length_k, as transformers' collator.
    `masking`: MLM masking of the row (its generator, when set, makes masks reproducible)."""

    masking: DataCollatorForLanguageModeling | None = None
    return_flash_attn_kwargs: bool = False

    def __call__(self, features: Sequence[dict]) -> dict:
        features = [f for f in features if len(f["input_ids"]) > 0]
        if not features:
            raise ValueError("FlatteningCollator received a batch where every example is empty")
        lengths = [len(f["input_ids"]) for f in features]
        batch = {
            key: torch.tensor([t for f in features for t in f[key]], dtype=torch.long)[None]
            for key in FLATTENED_KEYS
            if key in features[0]
        }
        batch["position_ids"] = torch.cat([torch.arange(length) for length in lengths])[None]
        label_key = "labels" if "labels" in features[0] else "label" if "label" in features[0] else None
        if label_key is not None:
            labels = [f[label_key] for f in features]
            if isinstance(labels[0], Sequence) or (torch.is_tensor(labels[0]) and labels[0].dim() > 0):
                batch["labels"] = torch.tensor([t for label in labels for t in label], dtype=torch.long)[None]
            else:
                batch["labels"] = torch.tensor(labels)
        special = batch.pop("special_tokens_mask", None)
        if self.masking is not None:
            if "labels" in batch:
                raise ValueError("examples with labels cannot be masked for MLM: masking makes the labels")
            batch["input_ids"], batch["labels"] = self.masking.torch_mask_tokens(batch["input_ids"], special)
        if self.return_flash_attn_kwargs:
            cu_seq_lens = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
            batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = cu_seq_lens
            batch["max_length_q"] = batch["max_length_k"] = max(lengths)
        return batch
