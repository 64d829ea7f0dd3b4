"""Exact attention with relative-position scores, never holding an n x n bias or probability matrix.

Relative terms (relative.py) give the score s_ij = q_i . k_j / sqrt(d) + b_ij where b_ij depends on
i, j only through a table column c(j - i). Split each query row's keys into three parts:

* the band |j - i| <= r: b_ij = band[i, j - i + r], explicit: dense matmuls of each block of B
  queries against its B + 2r keys, O(n (B + 2r) d), entries off the band masked;
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


def _band_valid(keep: Tensor | None, n: int, reach: int, device) -> Tensor:
    """(batch or 1, 1, n, 2r + 1) bool: key j = i + t - r exists and is a real token."""
    key_index = torch.arange(n, device=device)[:, None] + torch.arange(2 * reach + 1, device=device) - reach
    inside = (key_index >= 0) & (key_index < n)
    if keep is None:
        return inside[None, None]
    return (inside & F.pad(keep, (reach, reach))[:, key_index + reach])[:, None]


class _BandBlocks:
    """The band as dense matmuls: query block b (rows bB .. bB + B - 1) against its key window
    (rows bB - r .. bB + B + r - 1), (B x (B + 2r)) scores per block; band entry [i, t] (key
    i + t - r) sits at [a, a + t] of its block, a = i - bB. Block size B >= 2r, so a window
    overlaps only the next block's first 2r rows."""

    def __init__(self, n: int, reach: int):
        self.n, self.reach, self.width = n, reach, 2 * reach + 1
        self.size = max(32, 2 * reach)
        self.count = -(-n // self.size)
        self.padded = self.count * self.size

    def blocks(self, x: Tensor, fill: float = 0.0) -> Tensor:
        """(..., n, c) -> (..., blocks, B, c), rows past n filled."""
        if self.padded > self.n:
            x = F.pad(x, (0, 0, 0, self.padded - self.n), value=fill)
        return x.unflatten(-2, (self.count, self.size))

    def windows(self, x: Tensor) -> Tensor:
        """(..., n, c) -> (..., blocks, B + 2r, c), the keys each query block can reach in the band."""
        x = F.pad(x, (0, 0, self.reach, self.padded - self.n + self.reach))
        return x.unfold(-2, self.size + 2 * self.reach, self.size).transpose(-1, -2)

    def fold(self, grad_windows: Tensor) -> Tensor:
        """Adjoint of `windows`: (..., blocks, B + 2r, c) -> (..., n, c), overlaps summed."""
        *lead, _, _, c = grad_windows.shape
        size, reach = self.size, self.reach
        grad = grad_windows.new_zeros(*lead, self.padded + size, c)
        grad[..., :self.padded, :] += grad_windows[..., :size, :].flatten(-3, -2)
        grad[..., size:, :].unflatten(-2, (self.count, size))[..., :2 * reach, :] += grad_windows[..., size:, :]
        return grad[..., reach:reach + self.n, :]

    def band(self, scores: Tensor) -> Tensor:
        """(..., blocks, B, B + 2r) contiguous -> view (..., blocks, B, 2r + 1) of entries [a, a + t]."""
        stride = list(scores.stride())
        stride[-2] += 1
        return scores.as_strided((*scores.shape[:-1], self.width), stride, scores.storage_offset())

    def unblock(self, x: Tensor) -> Tensor:
        """(..., blocks, B, ...) -> (..., n, ...)."""
        return x.flatten(-3, -2)[..., :self.n, :] if x.dim() > 4 else x.flatten(-2)[..., :self.n]

    def scores(self, q_scaled: Tensor, k: Tensor, band: Tensor, valid: Tensor) -> Tensor:
        """(batch, heads, blocks, B, B + 2r) scores in the accumulation dtype, -inf off the band
        and at missing or pad keys."""
        scores = torch.matmul(self.blocks(q_scaled), self.windows(k).transpose(-1, -2)).to(_acc(q_scaled))
        off_band = torch.ones(self.size, self.size + 2 * self.reach, dtype=torch.bool, device=k.device)
        self.band(off_band).fill_(False)
        scores.masked_fill_(off_band, float("-inf"))
        self.band(scores).add_(self.blocks(band.to(scores.dtype).masked_fill(~valid, float("-inf")), 0.0))
        return scores


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


class _Augmented:
    """q / sqrt(d), k, v for the fused calls; with key terms one extra column carries them:
    (q / sqrt(d), 1) . (k, key_j), v padded with a zero column to the same head size."""

    def __init__(self, q_scaled: Tensor, k: Tensor, v: Tensor, with_key: bool):
        self.k, self.with_key = k, with_key
        self.q = torch.cat([q_scaled, q_scaled.new_ones(*q_scaled.shape[:-1], 1)], -1) if with_key else q_scaled
        self.v = _widen(v) if with_key else v

    def keys(self, key_term: Tensor | None) -> Tensor:
        return torch.cat([self.k, key_term[..., None].to(self.k.dtype)], -1) if self.with_key else self.k


def _widen(x: Tensor) -> Tensor:
    return torch.cat([x, x.new_zeros(*x.shape[:-1], 1)], -1)


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
        blocks = _BandBlocks(n, reach)
        q_scaled = q * scale
        scores = blocks.scores(q_scaled, k, band, _band_valid(keep, n, reach, q.device))
        lse = blocks.unblock(torch.logsumexp(scores, dim=-1))
        augmented = _Augmented(q_scaled, k, v, key_left is not None)
        parts = []
        for side, row, key in (("left", row_left, key_left), ("right", row_right, key_right)):
            part = _OffBand(side, n, reach)
            if part.length == 0:
                continue
            out_p, lse_p = flash_forward(
                part.take(augmented.q, part.queries), part.take(augmented.keys(key), part.keys),
                part.take(augmented.v, part.keys), is_causal=True, attn_mask=part.pad_mask(keep, q.dtype), scale=1.0)
            lse_p = part.put(lse_p[..., None], part.queries, n, float("-inf"))[..., 0]
            if row is not None:
                lse_p = lse_p + row.to(_acc(q))
            parts.append((part, out_p[..., :d], lse_p))
            lse = torch.logaddexp(lse, lse_p)
        probs = torch.exp(scores - blocks.blocks(lse[..., None], 0.0))
        out = blocks.unblock(torch.matmul(probs.to(v.dtype), blocks.windows(v))).to(_acc(q))
        for part, out_p, lse_p in parts:
            weight = torch.exp(lse_p - lse)[..., part.queries, None]
            out[..., part.queries, :] += weight * part.take(out_p, slice(None)).to(out.dtype)
        out = out.to(q.dtype)
        has_rows = row_left is not None and bool(parts)
        # the row terms' gradients need the left part's own output and weight (see backward)
        left_out = parts[0][0].put(parts[0][1], parts[0][0].queries, n) if has_rows else None
        left_lse = parts[0][2] if has_rows else None
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
        blocks = _BandBlocks(n, reach)
        q_scaled = q * scale
        scores = blocks.scores(q_scaled, k, band, _band_valid(keep, n, reach, q.device))
        probs = torch.exp(scores - blocks.blocks(lse[..., None], 0.0))
        k_windows, v_windows, dout_blocks = blocks.windows(k), blocks.windows(v), blocks.blocks(grad_out)
        grad_probs = torch.matmul(dout_blocks, v_windows.transpose(-1, -2)).to(_acc(q))
        grad_block_scores = probs * (grad_probs - blocks.blocks(row_term[..., None]))
        grad_scores = blocks.unblock(blocks.band(grad_block_scores))
        ds = grad_block_scores.to(q.dtype)
        grad_q = blocks.unblock(torch.matmul(ds, k_windows)).to(_acc(q)) * scale
        grad_k = blocks.fold(torch.matmul(ds.transpose(-1, -2), blocks.blocks(q_scaled))).to(_acc(q))
        grad_v = blocks.fold(torch.matmul(probs.to(v.dtype).transpose(-1, -2), dout_blocks)).to(_acc(q))
        del scores, probs, grad_probs, grad_block_scores, ds, k_windows, v_windows, dout_blocks  # peak memory
        grad_key = {}
        augmented = _Augmented(q_scaled, k, v, key_left is not None)
        grad_part, out_part = (grad_out, out) if key_left is None else (_widen(grad_out), _widen(out))
        for side, row, key in (("left", row_left, key_left), ("right", row_right, key_right)):
            if not ctx.has_parts:
                break
            part = _OffBand(side, n, reach)
            # the kernel's P_ij = exp(s_ij - lse_i) with the merged lse minus the row constant it never saw
            kernel_lse = lse if row is None else lse - row.to(_acc(q))
            gq, gk, gv = flash_backward(
                part.take(grad_part, part.queries), part.take(augmented.q, part.queries),
                part.take(augmented.keys(key), part.keys), part.take(augmented.v, part.keys),
                part.take(out_part, part.queries),
                part.take(kernel_lse[..., None], part.queries)[..., 0].contiguous(), 0.0, True,
                attn_mask=part.pad_mask(keep, q.dtype), scale=1.0)
            back = slice(None)
            grad_q[..., part.queries, :] += part.take(gq[..., :d], back).to(grad_q.dtype) * scale
            grad_k[..., part.keys, :] += part.take(gk[..., :d], back).to(grad_k.dtype)
            grad_v[..., part.keys, :] += part.take(gv[..., :d], back).to(grad_v.dtype)
            if key is not None:
                grad_key[side] = part.put(gk[..., d:], part.keys, n)[..., 0].to(_acc(q))
            del gq, gk, gv
        grad_rows = [None, None]
        if left_out is not None:
            # a row constant's gradient is the sum of dS_ij over its part: w_p (dO_i . O^p_i - D_i) for
            # the left part; sum_j dS_ij = 0 over all keys, so the right part's is minus band and left
            left = torch.exp(left_lse - lse) * ((dout * left_out.to(_acc(q))).sum(-1) - row_term)
            right = -(grad_scores.sum(-1) + left) * (torch.arange(n, device=q.device) < n - reach - 1)
            grad_rows = [left if row_left is not None else None, right if row_right is not None else None]
        return (grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), grad_scores.to(band.dtype),
                *grad_rows, grad_key.get("left"), grad_key.get("right"), None, None)


# Below this length the dense bias with SDPA's math kernel is faster on CPU (one attention layer, 2
# threads, forward+backward vs plain SDPA: n = 512 banded 3.1x, dense 1.9x; n = 1024 banded 2.5x,
# dense 2.9x; benchmarks/RESULTS.md, issue 11): the CPU flash kernel's causal mode skips nothing
# below 1024 keys, so the two off-band calls cost two full ones.
BANDED_MIN_LENGTH = 1024


def takes_banded_path(q: Tensor, backend: str, dropout_p: float, need_weights: bool) -> bool:
    """The banded path serves "sdpa" on CPU from BANDED_MIN_LENGTH tokens on. It cannot drop
    probabilities (the fused CPU kernel has no dropout it could replay in backward) nor return them;
    those cases keep the dense bias, and so does a graph being traced by torch.export / ONNX (the length
    test would pin the dynamic sequence axis to one side of BANDED_MIN_LENGTH)."""
    if torch.compiler.is_exporting():
        return False
    return (backend == "sdpa" and q.device.type == "cpu" and dropout_p == 0.0 and not need_weights
            and q.shape[-2] >= BANDED_MIN_LENGTH)


def banded_relative_attention(q, k, v, band, row_left, row_right, key_left, key_right, keep, reach) -> Tensor:
    return BandedRelativeAttention.apply(q, k, v, band.contiguous(), row_left, row_right, key_left, key_right,
                                         keep, reach)
