"""Rotary positions (RoFormer, Su et al. 2021) on the queries and keys of every self-attention head.

The rotate-half layout (GPT-NeoX's, as transformers' RoFormer / ModernBERT / Llama compute it): channel c of a
head's d channels and channel c + d/2 form a pair that turns by angle p theta^(-2c/d) at position p,

    x -> x cos + rotate_half(x) sin,   rotate_half(x) = (-x[d/2:], x[:d/2]),

so that q_i . k_j depends on positions only through p_i - p_j. The positions are the tokens' position ids: 0, 1,
... along a padded row unless given, and restarting at every sequence of a flattened batch, so that each sequence
is rotated as if alone. The angles are computed in float32 (float64 for float64 inputs) and the rotation too, then
cast back, as transformers' ModernBERT does. No parameter: nothing is learned or saved.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotary_angles(positions: Tensor, dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin (batch or 1, n, dim) of positions (batch or 1, n), in float32 (float64 for float64)."""
    acc = torch.promote_types(dtype, torch.float32)
    inverse = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=acc, device=positions.device) / dim))
    angles = positions[..., None].to(acc) * inverse
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


def rotate_queries_and_keys(query: Tensor, key: Tensor, positions: Tensor, num_heads: int,
                            theta: float) -> tuple[Tensor, Tensor]:
    """query, key (batch, n, heads * d) rotated at positions (batch or 1, n)."""
    cos, sin = rotary_angles(positions, query.shape[-1] // num_heads, theta, query.dtype)
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
    unrotated = relative is not None and relative.reads_projections and terms_read == "unrotated"
    tables_from = (query, key) if unrotated else None
    return *rotate_queries_and_keys(query, key, positions, num_heads, theta), tables_from
