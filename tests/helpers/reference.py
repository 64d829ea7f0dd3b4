"""Slow, obviously-correct float64 references written with explicit loops over positions.

They read the weights out of our modules but share no code with them: every score, tap and
offset is computed one at a time from the papers' formulas (a score for every sequence and head at once).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import Tensor, nn


def depthwise_conv_loops(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """out[b, t, c] = bias[c] + sum_tap weight[c, 0, tap] * x[b, t + tap - K//2, c] (zero outside)."""
    batch, n, channels = x.shape
    taps = weight.shape[-1]
    out = torch.zeros(batch, n, channels, dtype=torch.float64)
    for t in range(n):
        for tap in range(taps):
            s = t + tap - taps // 2
            if 0 <= s < n:
                out[:, t, :] += weight[:, 0, tap].double() * x[:, s, :].double()
        if bias is not None:
            out[:, t, :] += bias.double()
    return out


def linear(x: Tensor, layer: nn.Linear) -> Tensor:
    out = x.double() @ layer.weight.double().T
    return out + layer.bias.double() if layer.bias is not None else out


def composite_projection(x: Tensor, projection: nn.Module) -> Tensor:
    if isinstance(projection, nn.Linear):
        return linear(x, projection)
    conv = projection.depthwise
    convolved = depthwise_conv_loops(x, conv.weight, conv.bias)
    return torch.cat([linear(convolved, projection.pointwise), linear(x, projection.linear)], dim=-1)


def relative_term(table: Tensor, offset: int, reach: int, clip: bool) -> Tensor | float:
    """Column of a (..., 2r+1) table for a relative offset: clipped to the edge, or zero outside."""
    if abs(offset) > reach and not clip:
        return 0.0
    return table[..., max(-reach, min(reach, offset)) + reach]


def score_with_relative_terms(rel, q_i: Tensor, k_j: Tensor, i: int, j: int, terms_q_i: Tensor | None = None,
                              terms_k_j: Tensor | None = None) -> Tensor:
    """s_ij = q_i . k_j / sqrt(d) + beta[h, c(j - i)] + q_i . W[:, c(j - i)] / sqrt(d) + k_j . U[:, c(i - j)] / sqrt(d)
    of one pair (i, j) in every sequence and head h at once (q_i, k_j: (batch, heads, d) -> (batch, heads)), for the
    terms `rel` (a RelativePositionBias or None) has; the dynamic terms read terms_q_i / terms_k_j where given (under
    rotary positions: the query and key before their rotation)."""
    d = q_i.shape[-1]
    s = (q_i * k_j).sum(-1) / math.sqrt(d)
    if rel is None:
        return s
    q_i = q_i if terms_q_i is None else terms_q_i
    k_j = k_j if terms_k_j is None else terms_k_j
    r, clip = rel.reach, rel.clip
    if rel.fixed is not None:  # (heads,): each head's beta
        s = s + relative_term(rel.fixed.double(), j - i, r, clip)
    if rel.query_kernel is not None:
        w = relative_term(rel.query_kernel.double(), j - i, r, clip)
        s = s + (q_i @ w if torch.is_tensor(w) else 0.0) / math.sqrt(d)
    if rel.key_kernel is not None:
        u = relative_term(rel.key_kernel.double(), i - j, r, clip)
        s = s + (k_j @ u if torch.is_tensor(u) else 0.0) / math.sqrt(d)
    if rel.alibi is not None:  # ALiBi, MosaicBERT's symmetric form: -m_h |i - j|, each head's slope m_h
        s = s - torch.tensor(rel.alibi, dtype=torch.float64) * abs(i - j)
    return s


def rotary_loops(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """RoFormer's rotation in the rotate-half layout, one channel pair at a time: channels c and c + d/2 of a head
    (x: (batch, n, heads, d)) turn by the angle p theta^(-2c/d) at position p (positions: (batch or 1, n))."""
    batch, n, _, d = x.shape
    x = x.double()
    out = torch.empty_like(x)
    half = d // 2
    for b in range(batch):
        for t in range(n):
            p = float(positions[b if positions.shape[0] > 1 else 0, t])
            for c in range(half):
                angle = p * theta ** (-2 * c / d)
                first, second = x[b, t, :, c], x[b, t, :, c + half]
                out[b, t, :, c] = first * math.cos(angle) - second * math.sin(angle)
                out[b, t, :, c + half] = second * math.cos(angle) + first * math.sin(angle)
    return out


def rotated(module, q: Tensor, k: Tensor, positions: Tensor | None) -> tuple[Tensor, Tensor]:
    """q, k (batch, n, heads, d) rotated where `module` has rotary positions (0 .. n - 1 unless given)."""
    if getattr(module, "rope_theta", None) is None:
        return q, k
    if positions is None:
        positions = torch.arange(q.shape[1])[None]
    return rotary_loops(q, positions, module.rope_theta), rotary_loops(k, positions, module.rope_theta)


def terms_read(module, q: Tensor, k: Tensor, turned_q: Tensor, turned_k: Tensor) -> tuple[Tensor, Tensor]:
    """What the dynamic relative terms read beside rotary: the projections before the rotation, or the turned ones
    where the config says "rotated" (convattn before 2026-11-29)."""
    if module.config.rotary_relative_terms == "rotated":
        return turned_q, turned_k
    return q, k


def composite_attention_loops(module, x: Tensor, keep: Tensor, positions: Tensor | None = None) -> Tensor:
    """Reference for `CompositeSelfAttention` in eval mode: returns the (batch, n, H) context."""
    x = x.double()
    batch, n, hidden = x.shape
    heads = module.num_heads
    d = hidden // heads
    if module.conv_projection_input:
        x = x * keep[..., None].double()
    q = composite_projection(x, module.query).view(batch, n, heads, d)
    k = composite_projection(x, module.key).view(batch, n, heads, d)
    values = composite_projection(x, module.value)
    v = values.view(batch, n, heads, d)
    turned_q, turned_k = rotated(module, q, k, positions)
    terms = terms_read(module, q, k, turned_q, turned_k)
    context = relative_attention_loops(module.relative, turned_q, turned_k, v, keep, *terms).reshape(batch, n, hidden)
    if module.value_conv is not None:
        zeroed = values * keep[..., None].double()
        context = context + depthwise_conv_loops(zeroed, module.value_conv.weight, module.value_conv.bias)
    return context


def in_float64(rel):
    """The terms of `rel` with its tables converted to float64 once, so that their gradients sum in float64 over all
    pairs before rounding to the parameters' dtype (not once per pair)."""
    if rel is None:
        return None
    tables = {name: None if t is None else t.double() for name, t in
              (("fixed", rel.fixed), ("query_kernel", rel.query_kernel), ("key_kernel", rel.key_kernel))}
    return SimpleNamespace(reach=rel.reach, clip=rel.clip, alibi=rel.alibi, **tables)


def relative_attention_loops(rel, q: Tensor, k: Tensor, v: Tensor, keep: Tensor, terms_q: Tensor | None = None,
                             terms_k: Tensor | None = None) -> Tensor:
    """Softmax attention with relative terms, one (query, key) pair at a time, for every sequence and head at once
    (a loop per sequence and head paid Python's overhead batch x heads times over for the same numbers); q, k, v are
    (batch, n, heads, d); the dynamic terms read terms_q, terms_k where given (`score_with_relative_terms`)."""
    terms_q, terms_k = (q if terms_q is None else terms_q), (k if terms_k is None else terms_k)
    rel = in_float64(rel)
    n = q.shape[1]
    rows = []
    for i in range(n):
        scores = torch.stack([score_with_relative_terms(rel, q[:, i], k[:, j], i, j, terms_q[:, i], terms_k[:, j])
                              for j in range(n)], dim=-1)  # (batch, heads, keys)
        probs = torch.softmax(scores.masked_fill(~keep[:, None, :], -math.inf), dim=-1)
        rows.append(sum(probs[..., j, None] * v[:, j] for j in range(n)))  # (batch, heads, d)
    return torch.stack(rows, dim=1)


def convbert_self_attention_loops(module, x: Tensor, keep: Tensor, positions: Tensor | None = None) -> Tensor:
    """The self-attention heads of `ConvBertMixedAttention` in eval mode, one score at a time, with its relative
    terms: the (batch, n, H / 2) half of its context."""
    batch, n, _ = x.shape
    heads, d = module.num_heads, module.head_size
    q = linear(x, module.query).view(batch, n, heads, d)
    k = linear(x, module.key).view(batch, n, heads, d)
    v = linear(x, module.value).view(batch, n, heads, d)
    turned_q, turned_k = rotated(module, q, k, positions)
    terms = terms_read(module, q, k, turned_q, turned_k)
    return relative_attention_loops(module.relative, turned_q, turned_k, v, keep, *terms).reshape(batch, n, heads * d)


def conv_heads_loops(module, x, keep, masked: bool, kernel_from: str = "query"):
    """The span-based dynamic convolution heads of `ConvBertMixedAttention`, one position and tap at a time.

    kernel_from="query" (Jiang et al.): query i's K logits, softmaxed over all taps, taps outside weigh zeros.
    kernel_from="key" (Chang et al.'s code): tap t of query i scores logits[j, t] of its key j = i + t - K//2,
    and only the taps whose key is a real token enter the softmax."""
    batch, n, _ = x.shape
    heads, d, taps = module.num_heads, module.head_size, module.kernel_size
    real = keep[..., None].double() if masked else torch.ones(batch, n, 1, dtype=torch.float64)
    sep = module.key_conv_attn_layer
    spans = depthwise_conv_loops(x * real, sep.depthwise.weight, sep.depthwise.bias)
    key_span = spans @ sep.pointwise.weight[:, :, 0].double().T + sep.bias[:, 0].double()
    logits = linear(key_span * linear(x, module.query), module.conv_kernel_layer).view(batch, n, heads, taps)
    value = (linear(x, module.conv_out_layer) * real).view(batch, n, heads, d)
    out = torch.zeros(batch, n, heads, d, dtype=torch.float64)
    for b in range(batch):
        for i in range(n):
            for g in range(heads):
                if kernel_from == "query":
                    kernel = torch.softmax(logits[b, i, g], dim=0)
                    for t in range(taps):
                        s = i + t - taps // 2
                        if 0 <= s < n:
                            out[b, i, g] += kernel[t] * value[b, s, g]
                elif keep[b, i]:  # a pad query may have no real key in its window; its output is not compared
                    used = [t for t in range(taps) if 0 <= i + t - taps // 2 < n and keep[b, i + t - taps // 2]]
                    scores = torch.stack([logits[b, i + t - taps // 2, g, t] for t in used])
                    for weight, t in zip(torch.softmax(scores, dim=0), used, strict=True):
                        out[b, i, g] += weight * value[b, i + t - taps // 2, g]
    return out.reshape(batch, n, heads * d)


def mixed_attention_loops(module, x, keep, masked: bool, kernel_from: str = "query"):
    """Reference for `ConvBertMixedAttention` in eval mode: its (batch, n, H) output; `masked`: pads zeroed for the
    convolutions (convbert_padding="masked")."""
    self_attention = convbert_self_attention_loops(module, x, keep)
    return torch.cat([self_attention, conv_heads_loops(module, x, keep, masked, kernel_from)], dim=-1)
