"""Rotary positions (RoFormer, Su et al. 2021) on the queries and keys of every self-attention head.

The rotate-half layout (GPT-NeoX's, as transformers' RoFormer / ModernBERT / Llama compute it): channel c of a
head's d channels and channel c + d/2 form a pair that turns by angle p theta^(-2c/d) at position p,

    x -> x cos + rotate_half(x) sin,   rotate_half(x) = (-x[d/2:], x[:d/2]),

so that q_i . k_j depends on positions only through p_i - p_j. The positions are the tokens' position ids: 0, 1,
... along a padded row unless given, and restarting at every sequence of a flattened batch, so that each sequence
is rotated as if alone. The angles are computed in float32 (float64 for float64 inputs) and the rotation too, then
cast back, as transformers' ModernBERT does. No parameter: nothing is learned or saved.

Where only the attention scores read the turned vectors (no relative term reads them: the terms read none, or the
projections before the turn), the attention modules take them with each pair's two channels side by side: a pair is
then one complex number and its turn one complex product. The same reordering of q and k leaves every q . k as it
was. Rotary alone gets the pairs straight from its projections, whose weights' rows are reordered
(`turned_projections`); elsewhere a copy reorders q and k (`pairs=True`). One layer forward + backward, 16 x 512
tokens, H 256, 2 cores: 1.02x plain SDPA's time, 1.04x with the copy, 1.13x with the rotate-half formula's five
passes forward and about eight backward (`python benchmarks/attention_layer.py --arms none,rotary,rotary-halves`).
Under tracing (torch.compile, export) the formula stays: the compilers fuse it, and ONNX has no complex numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from convattn.attention.core import is_tracing

# False: the rotate-half formula on every path (benchmarks/attention_layer.py's arm rotary-halves sets it, to
# measure what the pair order saves)
PAIR_ORDER = True
# where the pair order's complex product runs (other backends' complex support varies): the formula elsewhere
COMPLEX_DEVICES = ("cpu", "cuda")


def pairs_run_on(device: torch.device) -> bool:
    """Whether the pair order's complex product turns tensors on `device` now: PAIR_ORDER on, CPU or CUDA, and not
    under tracing (the formula there)."""
    return PAIR_ORDER and device.type in COMPLEX_DEVICES and not is_tracing()


def pair_angles(positions: Tensor, dim: int, theta: float, dtype: torch.dtype) -> Tensor:
    """(batch or 1, n, dim / 2): pair c's angle p theta^(-2c/d) at positions (batch or 1, n), in float32 (float64
    for float64)."""
    acc = torch.promote_types(dtype, torch.float32)
    inverse = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=acc, device=positions.device) / dim))
    return positions[..., None].to(acc) * inverse


def rotary_angles(positions: Tensor, dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin (batch or 1, n, dim) of positions (batch or 1, n), each pair's angle at c and c + d/2."""
    angles = pair_angles(positions, dim, theta, dtype)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, num_heads: int) -> Tensor:
    """x (batch, n, heads * d), every head rotated by cos, sin (batch or 1, n, d)."""
    heads = x.unflatten(-1, (num_heads, -1)).to(cos.dtype)
    rotated = heads * cos[..., None, :] + rotate_half(heads) * sin[..., None, :]
    return rotated.flatten(-2).to(x.dtype)


def turns(positions: Tensor, dim: int, theta: float, dtype: torch.dtype) -> Tensor:
    """cos + i sin of every pair's angle, complex (batch or 1, n, 1, dim / 2), in complex64 (complex128 for
    float64): one unit complex number per pair, heads broadcast."""
    angles = pair_angles(positions, dim, theta, dtype)[..., None, :]
    return torch.polar(torch.ones_like(angles), angles)


def rotate_pairs(x: Tensor, turn: Tensor, num_heads: int) -> Tensor:
    """x (batch, n, heads * d) rotated as `rotate` does, each head's channels reordered to c, c + d/2 side by side
    (c = 0 .. d/2 - 1): the first of a pair is the real part, the second the imaginary, turned by one complex
    product. The reordering copy and the product are the whole cost, forward and backward."""
    halves = x.unflatten(-1, (num_heads, 2, -1)).transpose(-1, -2)
    return _turn(halves.to(turn.real.dtype, copy=True, memory_format=torch.contiguous_format), turn, x.dtype)


def _turn(paired: Tensor, turn: Tensor, dtype: torch.dtype) -> Tensor:
    """(..., heads, d/2, 2) pairs, contiguous in turn's real dtype, times the turns -> (..., heads * d) in dtype."""
    return torch.view_as_real(torch.view_as_complex(paired) * turn).flatten(-3).to(dtype)


def pair_order(num_heads: int, dim: int, device: torch.device) -> Tensor:
    """(heads * dim,): a projection's output channels in pair order, within each head c, c + d/2 side by side."""
    return torch.arange(num_heads * dim, device=device).view(num_heads, 2, dim // 2).transpose(-1, -2).flatten()


def turned_projections(hidden: Tensor, query_layer: nn.Module, key_layer: nn.Module, positions: Tensor,
                       num_heads: int, theta: float | None, relative=None) -> tuple[Tensor, Tensor] | None:
    """The query and key projections of `hidden`, turned, each head's channels in pair order, for a layer whose
    scores alone read them: the weights' rows are reordered (an (H x H) gather), so the projections give pairs
    side by side and no copy of q or k reorders them, forward or backward (one layer at 16 x 512: 1.005x plain
    SDPA's time against 1.04x reordering q and k). None where this does not apply: projections other than a plain
    nn.Linear without hooks holding plain tensors (the convolutional ones, adapters, quantised or sharded layers),
    no rotary (theta None), `relative` terms that read q or k, or where `pairs_run_on` says no; the caller then
    projects and turns as `rotated_for_attention` does."""
    if theta is None or (relative is not None and relative.reads_projections) or not pairs_run_on(hidden.device):
        return None
    if not all(type(layer) is nn.Linear and not layer._forward_hooks and not layer._forward_pre_hooks
               and type(layer.weight.data) is torch.Tensor for layer in (query_layer, key_layer)):  # not a DTensor
        return None
    dim = query_layer.out_features // num_heads
    order = pair_order(num_heads, dim, hidden.device)
    turn = turns(positions, dim, theta, hidden.dtype)

    def project(layer: nn.Linear) -> Tensor:
        x = F.linear(hidden, layer.weight[order], None if layer.bias is None else layer.bias[order])
        return _turn(x.unflatten(-1, (num_heads, -1, 2)).to(turn.real.dtype), turn, x.dtype)

    return project(query_layer), project(key_layer)


def rotate_queries_and_keys(query: Tensor, key: Tensor, positions: Tensor, num_heads: int, theta: float,
                            pairs: bool = False) -> tuple[Tensor, Tensor]:
    """query, key (batch, n, heads * d) rotated at positions (batch or 1, n); with `pairs` (where `pairs_run_on`),
    each head's channels in pair order (`rotate_pairs`), for a reader of q . k alone."""
    dim = query.shape[-1] // num_heads
    if pairs and pairs_run_on(query.device):
        turn = turns(positions, dim, theta, query.dtype)
        return rotate_pairs(query, turn, num_heads), rotate_pairs(key, turn, num_heads)
    cos, sin = rotary_angles(positions, dim, theta, query.dtype)
    return rotate(query, cos, sin, num_heads), rotate(key, cos, sin, num_heads)


def rotated_for_attention(query: Tensor, key: Tensor, positions: Tensor, num_heads: int, theta: float | None,
                          relative, terms_read: str = "unrotated"
                          ) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]:
    """(query, key) rotated at positions (unchanged where theta is None), and the projections that relative terms
    reading queries or keys (dynamic_query, dynamic_key) take beside them: with terms_read "unrotated" (the config's
    rotary_relative_terms), query and key before the rotation, so that each term depends on the offset j - i alone,
    as without rotary (terms read from turned vectors change when a whole sequence shifts); None where no term reads
    them, nothing turned, or the terms read the rotated ones ("rotated": convattn before 2026-11-29)."""
    if theta is None:
        return query, key, None
    reads = relative is not None and relative.reads_projections
    tables_from = (query, key) if reads and terms_read == "unrotated" else None
    # the turned vectors in pair order wherever only the scores read them (not the terms of "rotated")
    scores_only = not reads or tables_from is not None
    return *rotate_queries_and_keys(query, key, positions, num_heads, theta, pairs=scores_only), tables_from
