"""Relative-position attention with FlexAttention, for attn_implementation="flex_attention".

A score_mod adds the relative terms read from the same O(n (2r + 1)) tables as bias.py builds, ALiBi's
-m_h |i - j| computed from the query and key indices (no table), and masks pad keys. (A BlockMask could
skip whole blocks of pad keys, but building one per batch, create_block_mask, cost 4-6 ms on an H100:
more than the attention itself at n = 512 and 2048.)
On CUDA the compiled kernel never forms an n x n matrix; on CPU, flex_attention runs eagerly
(forward only: torch 2.13 has no CPU backward), which the tests use to check the score_mod against the reference.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import flex_attention

from convattn.attention.relative.bias import RelativePositionBias


@cache
def _compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


def flex_relative_attention(q: Tensor, k: Tensor, v: Tensor, relative: RelativePositionBias,
                            keep: Tensor | None, tables_from: tuple[Tensor, Tensor] | None = None) -> Tensor:
    batch, heads, n, _ = q.shape
    reach, clip = relative.reach, relative.clip
    row_table, key_table = relative.tables(*(tables_from or (q, k)))
    slopes = relative.slopes(q)
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
        if slopes is not None:
            bias = bias - slopes[h] * offset.abs()
        score = score + bias
        if keep is not None:
            score = torch.where(keep[b, kv_idx], score, -float("inf"))
        return score

    attention = _compiled_flex() if q.is_cuda else flex_attention
    return attention(q, k, v, score_mod=score_mod)
