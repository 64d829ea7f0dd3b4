"""ALiBi alone on CPU: one flash-attention call, its bias a strided view of 2n - 1 numbers per head.

ALiBi's bias -m_h |i - j| depends on i - j alone: a Toeplitz matrix, whole in its 2n - 1 diagonals. With the keys
in reverse order (column j' holds key n - 1 - j'), entry [i, j'] is diagonal i + j', so the (n x n) mask is a view
of a (heads, 2n - 1) tensor with stride 1 along both axes. torch's CPU flash kernel reads an additive mask through
its strides: it takes this one as it is, never copied, and its 2n - 1 numbers per head stay in cache, where the
decomposition (decomposition.py) cuts the scores in parts, each with its own copies and merges. Reversing the keys
costs a copy of k and v (and of their gradients). One layer, forward and backward, against plain SDPA: 1.12x / 1.05x
at 512 x 16 / 2,048 x 4 tokens where the decomposition took 1.51x / 1.42x (RESULTS 8.9; measure again: python
benchmarks/attention_layer.py --arms none,alibi,alibi-decomposed).

Padding: a row whose real tokens are a prefix of length L attends to its first L keys, the last L columns of the
view (consecutive rows of one length share a call). Rows padded elsewhere, and every row of a traced graph (which
cannot branch on the data), carry their pads on one more channel: (q_i, 1) . (k_j, -max at pads), v widened by a
zero column. The mask takes no gradient (ALiBi has no parameter).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from convattn.attention.core import TokenMask, is_tracing


def alibi_diagonals(slopes: Tensor, n: int) -> Tensor:
    """(heads, 2n - 1): -m_h |t - (n - 1)| at t, ALiBi's bias on the diagonal i + j' = t of the reversed keys."""
    offsets = torch.arange(2 * n - 1, device=slopes.device, dtype=slopes.dtype) - (n - 1)
    return -slopes[:, None] * offsets.abs()


def reversed_key_mask(diagonals: Tensor, n: int, keys: int) -> Tensor:
    """(1, heads, n, keys): ALiBi's bias for n queries against the first `keys` keys, reversed (column j' holds key
    keys - 1 - j'): a view of `diagonals` (as `alibi_diagonals` made it for n, a tensor of its own), no (n x keys)
    tensor."""
    heads, length = diagonals.shape
    return diagonals.as_strided((1, heads, n, keys), (0, length, 1, 1), n - keys)


def _prefix_lengths(keep: Tensor) -> list[int | None]:
    """Per row, the count of real tokens where they are the row's first ones, else None."""
    lengths = keep.sum(-1)
    prefix = keep == (torch.arange(keep.shape[-1], device=keep.device) < lengths[:, None])
    return [length if whole else None for length, whole in zip(lengths.tolist(), prefix.all(-1).tolist(), strict=True)]


def _runs(lengths: list[int | None]) -> list[tuple[int, int, int | None]]:
    """Consecutive rows of one prefix length (or of padding elsewhere, None): (first, end, length)."""
    runs, first = [], 0
    for row in range(1, len(lengths) + 1):
        if row == len(lengths) or lengths[row] != lengths[first]:
            runs.append((first, row, lengths[first]))
            first = row
    return runs


def _attend_with_pad_channel(q: Tensor, k_reversed: Tensor, v_reversed: Tensor, keep_reversed: Tensor,
                             mask: Tensor) -> Tensor:
    """Rows padded anywhere: the pads on one more channel of q and k, their scale kept at 1 / sqrt(d)."""
    d = q.shape[-1]
    pads = torch.zeros(keep_reversed.shape, dtype=k_reversed.dtype, device=k_reversed.device)
    pads = pads.masked_fill(~keep_reversed, torch.finfo(k_reversed.dtype).min)  # finite: all-pad rows stay finite
    q = F.pad(q, (0, 1), value=1.0)
    k_reversed = torch.cat([k_reversed, pads[:, None, :, None].expand(*k_reversed.shape[:-1], 1)], dim=-1)
    out = F.scaled_dot_product_attention(q, k_reversed, F.pad(v_reversed, (0, 1)), attn_mask=mask, scale=d ** -0.5)
    return out[..., :d]


def toeplitz_alibi_attention(q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, mask: TokenMask | None) -> Tensor:
    """softmax(q k^T / sqrt(d) - m_h |i - j| + padding mask) v: q, k, v (batch, heads, n, d), slopes (heads,) in the
    operands' dtype (RelativePositionBias.slopes). No dropout: the CPU flash kernel has none."""
    n = q.shape[-2]
    diagonals = alibi_diagonals(slopes.to(q.dtype), n)
    k_reversed, v_reversed = k.flip(-2), v.flip(-2)
    if mask is None or not mask.has_padding:
        return F.scaled_dot_product_attention(q, k_reversed, v_reversed, attn_mask=reversed_key_mask(diagonals, n, n))
    if is_tracing():  # a traced graph cannot branch on the data: every row carries its pads on the extra channel
        return _attend_with_pad_channel(q, k_reversed, v_reversed, mask.keep.flip(-1),
                                        reversed_key_mask(diagonals, n, n))
    outputs = []
    for first, end, length in _runs(_prefix_lengths(mask.keep)):
        rows = slice(first, end)
        if length is None:
            outputs.append(_attend_with_pad_channel(q[rows], k_reversed[rows], v_reversed[rows],
                                                    mask.keep[rows].flip(-1), reversed_key_mask(diagonals, n, n)))
        else:
            # the first `length` keys are the reversed ones' last `length`; a row of pads alone attends to them all
            keys = slice(n - length, n) if length else slice(None)
            outputs.append(F.scaled_dot_product_attention(
                q[rows], k_reversed[rows, :, keys], v_reversed[rows, :, keys],
                attn_mask=reversed_key_mask(diagonals, n, length or n)))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)
