"""Relative-position attention with dropout on the probabilities, a block of query rows at a time.

The decomposition (decomposition.py) cannot drop probabilities on CPU: the CPU flash kernel has no dropout.
Here each block of S query rows gets its (S x n) slice of the dense bias and SDPA with dropout, under
activation checkpointing: the block's bias, probabilities and dropout mask exist only while the block is
computed, in forward and again in backward (with the same random numbers, restored by the checkpoint).
Memory is O(S n) where the dense bias holds several (n x n) tensors per head; the price is the forward
computed twice.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from convattn.attention.core import TokenMask, attend
from convattn.attention.relative.bias import RelativePositionBias
from convattn.attention.relative.decomposition import block_size


def _attend_rows(q_rows: Tensor, k: Tensor, v: Tensor, table_rows: Tensor, key_table: Tensor | None,
                 relative: RelativePositionBias, first_row: int, mask: TokenMask, dropout_p: float) -> Tensor:
    rows = slice(first_row, first_row + q_rows.shape[-2])
    bias = relative.bias(relative.row_table(table_rows), key_table, k.shape[-2], rows, q_rows)
    return attend(q_rows, k, v, bias=bias, mask=mask, dropout_p=dropout_p, attn_implementation="sdpa")[0]


def blockwise_relative_attention(q: Tensor, k: Tensor, v: Tensor, relative: RelativePositionBias, mask: TokenMask,
                                 dropout_p: float, tables_from: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """softmax(q k^T / sqrt(d) + relative bias + padding mask) with dropout, times v; q, k, v (batch, heads, n, d);
    tables_from: the queries and keys the relative terms read (dispatch.relative_attention), default q, k."""
    n = q.shape[-2]
    size = block_size(n, relative.reach, "blocks")
    table_q, table_k = tables_from or (q, k)
    key_table = relative.key_table(table_k)  # every block reads all n keys' entries: computed once, not per block
    blocks = [checkpoint(_attend_rows, q[..., start:start + size, :], k, v, table_q[..., start:start + size, :],
                         key_table, relative, start, mask, dropout_p, use_reentrant=False)
              for start in range(0, n, size)]
    return torch.cat(blocks, dim=-2)
