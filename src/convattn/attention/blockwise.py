"""Relative-position attention with dropout on the probabilities, a block of query rows at a time.

The banded path (banded.py) cannot drop probabilities: the CPU flash kernel it leans on has no dropout.
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

from convattn.attention import banded
from convattn.attention.core import TokenMask, attend
from convattn.attention.relative import RelativePositionBias

# From this length on the blockwise path serves attention dropout on CPU. One layer, 2 threads, attention
# dropout 0.1, against plain SDPA with dropout (its math kernel), peak RSS of a fresh process: at n = 512
# blockwise took 1.90x the time and 0.93x the memory, the dense bias 1.14x and 1.11x; at n = 2048 blockwise
# 2.02x the time and 0.51x the memory (771 MiB against 1,520), issue 11. The forward computed twice is
# worth paying where the dense bias's memory grows as n^2.
BLOCKWISE_MIN_LENGTH = 2048


def takes_blockwise_path(q: Tensor, backend: str, dropout_p: float, need_weights: bool) -> bool:
    """Dropout on CPU from BLOCKWISE_MIN_LENGTH tokens on; not while torch.export / ONNX trace a graph (the
    length test would pin the sequence axis)."""
    if torch.compiler.is_exporting():
        return False
    return (backend == "sdpa" and q.device.type == "cpu" and dropout_p > 0.0 and not need_weights
            and q.shape[-2] >= BLOCKWISE_MIN_LENGTH)


def _attend_rows(q_rows: Tensor, k: Tensor, v: Tensor, key_table: Tensor | None, relative: RelativePositionBias,
                 first_row: int, mask: TokenMask, dropout_p: float) -> Tensor:
    rows = slice(first_row, first_row + q_rows.shape[-2])
    bias = relative.bias(relative.row_table(q_rows), key_table, k.shape[-2], rows)
    return attend(q_rows, k, v, bias=bias, mask=mask, dropout_p=dropout_p, backend="sdpa")[0]


def blockwise_relative_attention(q: Tensor, k: Tensor, v: Tensor, relative: RelativePositionBias, mask: TokenMask,
                                 dropout_p: float) -> Tensor:
    """softmax(q k^T / sqrt(d) + relative bias + padding mask) with dropout, times v; q, k, v (batch, heads, n, d)."""
    n = q.shape[-2]
    size = banded.block_size(n, relative.reach)
    key_table = relative.key_table(k)  # every block reads all n keys' entries: computed once, not per block
    blocks = [checkpoint(_attend_rows, q[..., start:start + size, :], k, v, key_table, relative, start, mask,
                         dropout_p, use_reentrant=False)
              for start in range(0, n, size)]
    return torch.cat(blocks, dim=-2)
