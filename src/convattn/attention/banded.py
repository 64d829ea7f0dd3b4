"""Exact attention with relative-position scores, never holding an n x n bias or probability matrix.

Relative terms (relative.py) give the score s_ij = q_i . k_j / sqrt(d) + b_ij where b_ij depends on
i, j only through a table column c(j - i). Split each query row's keys into three parts:

* the band |j - i| <= r: b_ij = band[i, j - i + r], explicit in O(n (2r + 1) d);
* left of the band (j < i - r) and right of it (j > i + r): in "clip" mode b_ij = row_i + key_j
  (the edge columns of the row and key tables), in "zero" mode b_ij = 0.

An off-band part is a shifted-causal fused attention call (`is_causal` on offset slices of q and k,
the CPU flash kernel). Its per-row constant does not change its softmax, only its log-sum-exp
(lse + row_i); its per-key constant rides on one extra column, (q_i / sqrt(d), 1) . (k_j, key_j).
The parts merge by log-sum-exp: with w_p = exp(lse_p - lse), out = sum_p w_p out_p.

Backward (the flash-attention identities, dS_ij = P_ij (dO_i . v_j - D_i), D_i = dO_i . O_i): the
fused backward kernel of a part, fed grad_out = w_p dO and the *merged* output O, computes
w_p P^p_ij (dO_i . v_j - dO_i . O_i) = dS_ij exactly, so no log-sum-exp gradient is needed; the
row constant's gradient is sum_{j in part} dS_ij = w_p (dO_i . O^p_i - D_i).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

flash_forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _acc(x: Tensor) -> torch.dtype:
    """Softmax statistics in float32 for float32 / bfloat16 inputs, float64 for float64."""
    return torch.promote_types(x.dtype, torch.float32)


def _band_keys(x: Tensor, reach: int) -> Tensor:
    """(..., n, c) -> (..., n + 2r, c) zero-padded so rows t .. t + n - 1 are x[i + t - r]."""
    return F.pad(x, (0, 0, reach, reach))


def _band_valid(keep: Tensor | None, batch: int, n: int, reach: int, device) -> Tensor:
    """(batch or 1, 1, n, 2r + 1) bool: key j = i + t - r exists and is a real token."""
    key_index = torch.arange(n, device=device)[:, None] + torch.arange(2 * reach + 1, device=device) - reach
    inside = (key_index >= 0) & (key_index < n)
    if keep is None:
        return inside[None, None]
    padded = F.pad(keep, (reach, reach))
    return (inside & padded[:, key_index.clamp(-reach, n - 1 + reach) + reach])[:, None]


def _band_scores(q: Tensor, k_padded: Tensor, band: Tensor, valid: Tensor, scale: float) -> Tensor:
    n, width = q.shape[-2], band.shape[-1]
    scores = torch.stack([(q * k_padded[..., t:t + n, :]).sum(-1) for t in range(width)], dim=-1)
    scores = scores.to(_acc(q)) * scale + band.to(_acc(q))
    return scores.masked_fill(~valid, float("-inf"))


class _OffBand:
    """One side of the band as a fused causal call: which query rows and key rows it covers."""

    def __init__(self, side: str, n: int, reach: int):
        self.side, self.length = side, max(n - reach - 1, 0)
        # left: query i = a + r + 1 sees keys b <= a; right: query i = a sees keys j = b + r + 1, b >= a,
        # which is causal after flipping both sequences
        self.queries = slice(reach + 1, n) if side == "left" else slice(0, self.length)
        self.keys = slice(0, self.length) if side == "left" else slice(reach + 1, n)

    def take(self, x: Tensor, rows: slice) -> Tensor:
        """Rows of a (..., n, c) tensor, in the part's (causal) order."""
        x = x[..., rows, :]
        return x.flip(-2) if self.side == "right" else x

    def put(self, x: Tensor, rows: slice, n: int, fill: float = 0.0) -> Tensor:
        """Inverse of `take`: the part's rows back at their positions in (..., n, c), `fill` elsewhere."""
        x = x.flip(-2) if self.side == "right" else x
        return F.pad(x, (0, 0, rows.start, n - rows.stop), value=fill)

    def pad_mask(self, keep: Tensor | None, dtype: torch.dtype) -> Tensor | None:
        """Additive (batch, 1, 1, length) mask of the part's pad keys (finite, so an all-pad part
        gets a finite log-sum-exp and weight exp(lse_p - lse) = 0)."""
        if keep is None:
            return None
        keys = self.take(keep[..., None], self.keys)[..., 0]
        mask = torch.zeros(keys.shape, dtype=dtype, device=keep.device)
        return mask.masked_fill(~keys, torch.finfo(dtype).min)[:, None, None, :]


def _augment(q: Tensor, k: Tensor, v: Tensor, key_term: Tensor | None, scale: float):
    """q / sqrt(d), k, v; with a key term one extra column carries it: (q s, 1) . (k, key_j)."""
    if key_term is None:
        return q * scale, k, v
    return (torch.cat([q * scale, q.new_ones(*q.shape[:-1], 1)], -1),
            torch.cat([k, key_term[..., None].to(k.dtype)], -1), _widen(v))


def _widen(x: Tensor) -> Tensor:
    return torch.cat([x, x.new_zeros(*x.shape[:-1], 1)], -1)


def _weighted_sum(weights: Tensor, x_padded: Tensor) -> Tensor:
    """sum_t weights[..., i, t] x[i + t - r] in float32: (..., n, 2r + 1), (..., n + 2r, c) -> (..., n, c)."""
    n = weights.shape[-2]
    return sum(weights[..., t, None] * x_padded[..., t:t + n, :].to(_acc(x_padded)) for t in range(weights.shape[-1]))


class BandedRelativeAttention(torch.autograd.Function):
    """softmax(q k^T / sqrt(d) + relative bias + padding mask) v (see the module docstring).

    q, k, v: (batch, heads, n, d); band: (batch, heads, n, 2r + 1), the bias of key i + t - r at [i, t];
    row_*: (batch, heads, n) or None, the off-band bias per query row; key_*: (batch, heads, n) or
    None, per key; keep: (batch, n) bool or None.
    """

    @staticmethod
    def forward(ctx, q, k, v, band, row_left, row_right, key_left, key_right, keep, reach):
        n, d = q.shape[-2], q.shape[-1]
        scale = d ** -0.5
        valid = _band_valid(keep, q.shape[0], n, reach, q.device)
        scores = _band_scores(q, _band_keys(k, reach), band, valid, scale)
        lse = torch.logsumexp(scores, dim=-1)
        parts = []
        for side, row, key in (("left", row_left, key_left), ("right", row_right, key_right)):
            part = _OffBand(side, n, reach)
            if part.length == 0:
                continue
            qa, ka, va = _augment(q, k, v, key, scale)
            out_p, lse_p = flash_forward(part.take(qa, part.queries), part.take(ka, part.keys),
                                         part.take(va, part.keys), is_causal=True,
                                         attn_mask=part.pad_mask(keep, q.dtype), scale=1.0)
            out_p = part.put(out_p[..., :d], part.queries, n)
            lse_p = part.put(lse_p[..., None], part.queries, n, float("-inf"))[..., 0]
            if row is not None:
                lse_p = lse_p + row.to(_acc(q))
            parts.append((part, out_p, lse_p))
            lse = torch.logaddexp(lse, lse_p)
        out = _weighted_sum(torch.exp(scores - lse[..., None]), _band_keys(v, reach))
        for _, out_p, lse_p in parts:
            out = out + torch.exp(lse_p - lse)[..., None] * out_p.to(_acc(q))
        out = out.to(q.dtype)
        has_rows = row_left is not None and bool(parts)
        # the row terms' gradients need the left part's own output and weight (see backward)
        left_out, left_lse = (parts[0][1], parts[0][2]) if has_rows else (None, None)
        ctx.save_for_backward(q, k, v, band, row_left, row_right, key_left, key_right, keep, out, lse,
                              left_out, left_lse)
        ctx.reach, ctx.has_parts = reach, bool(parts)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, band, row_left, row_right, key_left, key_right, keep, out, lse, left_out, left_lse = (
            ctx.saved_tensors)
        reach, n, d = ctx.reach, q.shape[-2], q.shape[-1]
        scale = d ** -0.5
        grad_out = grad_out.contiguous()
        dout = grad_out.to(_acc(q))
        row_term = (dout * out.to(_acc(q))).sum(-1)  # D_i = dO_i . O_i
        # band: recompute its probabilities from the merged log-sum-exp
        valid = _band_valid(keep, q.shape[0], n, reach, q.device)
        k_padded, v_padded = _band_keys(k, reach), _band_keys(v, reach)
        probs = torch.exp(_band_scores(q, k_padded, band, valid, scale) - lse[..., None])
        width = 2 * reach + 1
        grad_probs = torch.stack([(dout * v_padded[..., t:t + n, :].to(_acc(q))).sum(-1) for t in range(width)], -1)
        grad_scores = probs * (grad_probs - row_term[..., None])
        grad_q = _weighted_sum(grad_scores * scale, k_padded)
        grad_k_padded = torch.zeros_like(k_padded, dtype=_acc(q))
        grad_v_padded = torch.zeros_like(v_padded, dtype=_acc(q))
        q_scaled = q.to(_acc(q)) * scale
        for t in range(width):
            grad_k_padded[..., t:t + n, :] += grad_scores[..., t, None] * q_scaled
            grad_v_padded[..., t:t + n, :] += probs[..., t, None] * dout
        grad_k, grad_v = grad_k_padded[..., reach:reach + n, :], grad_v_padded[..., reach:reach + n, :]
        grad_key = {}
        for side, row, key in (("left", row_left, key_left), ("right", row_right, key_right)):
            if not ctx.has_parts:
                break
            part = _OffBand(side, n, reach)
            qa, ka, va = _augment(q, k, v, key, scale)
            grad_part, out_part = (grad_out, out) if key is None else (_widen(grad_out), _widen(out))
            # the kernel's P_ij = exp(s_ij - lse_i) with the merged lse minus the row constant it never saw
            kernel_lse = lse if row is None else lse - row.to(_acc(q))
            gq, gk, gv = flash_backward(
                part.take(grad_part, part.queries), part.take(qa, part.queries), part.take(ka, part.keys),
                part.take(va, part.keys), part.take(out_part, part.queries),
                part.take(kernel_lse[..., None], part.queries)[..., 0].contiguous(), 0.0, True,
                attn_mask=part.pad_mask(keep, q.dtype), scale=1.0)
            grad_q += part.put(gq[..., :d], part.queries, n).to(_acc(q)) * scale
            gk, gv = part.put(gk, part.keys, n).to(_acc(q)), part.put(gv, part.keys, n).to(_acc(q))
            grad_k += gk[..., :d]
            grad_v += gv[..., :d]
            if key is not None:
                grad_key[side] = gk[..., d]
        grad_rows = [None, None]
        if left_out is not None:
            # a row constant's gradient is the sum of dS_ij over its part: w_p (dO_i . O^p_i - D_i) for
            # the left part; sum_j dS_ij = 0 over all keys, so the right part's is minus band and left
            left = torch.exp(left_lse - lse) * ((dout * left_out.to(_acc(q))).sum(-1) - row_term)
            right = -(grad_scores.sum(-1) + left) * (torch.arange(n, device=q.device) < n - reach - 1)
            grad_rows = [left if row_left is not None else None, right if row_right is not None else None]
        return (grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), grad_scores.to(band.dtype),
                *grad_rows, grad_key.get("left"), grad_key.get("right"), None, None)


def takes_banded_path(q: Tensor, backend: str, dropout_p: float, need_weights: bool) -> bool:
    """The banded path serves "sdpa" on CPU. It cannot drop probabilities (the fused CPU kernel has no
    dropout it could replay in backward) nor return them; those cases keep the dense bias."""
    return backend == "sdpa" and q.device.type == "cpu" and dropout_p == 0.0 and not need_weights


def banded_relative_attention(q, k, v, band, row_left, row_right, key_left, key_right, keep, reach) -> Tensor:
    return BandedRelativeAttention.apply(q, k, v, band.contiguous(), row_left, row_right, key_left, key_right,
                                         keep, reach)
