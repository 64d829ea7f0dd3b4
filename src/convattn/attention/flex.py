"""Relative-position attention with FlexAttention (the CUDA path of issue 11).

A score_mod adds the relative terms read from the same O(n (2r + 1)) tables as relative.py; the
padding is a BlockMask over keys, so blocks of pad keys are skipped. On CUDA the compiled kernel
never forms an n x n matrix; on CPU, flex_attention runs eagerly (forward only: torch 2.13 has no
CPU backward), which the tests use to check the score_mod against the reference.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from convattn.attention.relative import RelativePositionBias


@cache
def _compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


def takes_flex_path(q: Tensor, backend: str, dropout_p: float, need_weights: bool) -> bool:
    """attn_implementation="flex_attention", or "sdpa" on CUDA (chosen automatically there). FlexAttention
    has no dropout on the probabilities nor returns them; those cases keep the dense bias."""
    chosen = backend == "flex_attention" or (backend == "sdpa" and q.is_cuda)
    return chosen and dropout_p == 0.0 and not need_weights


def flex_relative_attention(q: Tensor, k: Tensor, v: Tensor, relative: RelativePositionBias,
                            keep: Tensor | None) -> Tensor:
    batch, heads, n, _ = q.shape
    reach, clip = relative.reach, relative.clip
    row_table, key_table = relative.tables(q, k)
    if row_table is not None:
        row_table = row_table.expand(batch, heads, n, 2 * reach + 1)

    def score_mod(score, b, h, q_idx, kv_idx):
        offset = kv_idx - q_idx
        column = offset.clamp(-reach, reach) + reach
        bias = torch.zeros_like(score)
        if row_table is not None:
            bias = bias + row_table[b, h, q_idx, column]
        if key_table is not None:
            # key j's term sits at column c(i - j) = 2r - c(j - i) of its own row
            bias = bias + key_table[b, h, kv_idx, 2 * reach - column]
        if not clip:
            bias = torch.where(offset.abs() <= reach, bias, torch.zeros_like(bias))
        return score + bias

    block_mask = None
    if keep is not None:
        block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: keep[b, kv_idx], batch, None, n, n,
                                       device=q.device)
    attention = _compiled_flex() if q.is_cuda else flex_attention
    return attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
