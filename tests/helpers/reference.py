"""Slow, obviously-correct float64 references written with explicit loops over positions.

They read the weights out of our modules but share no code with them: every score, tap and
offset is computed one at a time from the SPEC's formulas.
"""

from __future__ import annotations

import math

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


def composite_attention_loops(module, x: Tensor, keep: Tensor) -> Tensor:
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
    rel = module.relative
    out = torch.zeros(batch, n, heads, d, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(n):
                scores = []
                for j in range(n):
                    s = (q[b, i, h] @ k[b, j, h]) / math.sqrt(d)
                    if rel is not None:
                        r, clip = rel.reach, rel.clip
                        if rel.fixed is not None:
                            s = s + relative_term(rel.fixed[h].double(), j - i, r, clip)
                        if rel.query_kernel is not None:
                            w = relative_term(rel.query_kernel.double(), j - i, r, clip)
                            s = s + (q[b, i, h] @ w if torch.is_tensor(w) else 0.0) / math.sqrt(d)
                        if rel.key_kernel is not None:
                            u = relative_term(rel.key_kernel.double(), i - j, r, clip)
                            s = s + (k[b, j, h] @ u if torch.is_tensor(u) else 0.0) / math.sqrt(d)
                    scores.append(s if keep[b, j] else torch.tensor(-math.inf, dtype=torch.float64))
                probs = torch.softmax(torch.stack(scores), dim=0)
                for j in range(n):
                    out[b, i, h] += probs[j] * v[b, j, h]
    context = out.reshape(batch, n, hidden)
    if module.value_conv is not None:
        zeroed = values * keep[..., None].double()
        context = context + depthwise_conv_loops(zeroed, module.value_conv.weight, module.value_conv.bias)
    return context
