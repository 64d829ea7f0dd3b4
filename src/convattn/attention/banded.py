"""Exact attention with relative-position scores, never holding an n x n bias or probability matrix.

Relative terms (relative.py) give the score s_ij = q_i . k_j / sqrt(d) + b_ij where b_ij depends on
i, j only through a table column c(j - i): b_ij = band[i, j - i + r] on the band |j - i| <= r, and off
it, in "clip" mode, a constant per query row plus one per key, different left (j < i - r) and right
(j > i + r) of the band; in "zero" mode b_ij = 0 off the band.

Queries go in blocks of S rows; block [s, s + S) meets the band only in keys [s - r, s + S + r), its
window. Each block's keys split into three parts:

* the window, explicit: a dense (S x (S + 2r)) matmul with the band's bias and, beside the band, the
  off-band constants;
* the keys left of the window, [0, s - r), and right of it, [s + S + r, n): off the band for every query
  of the block, so each side is one rectangular call of the CPU flash kernel. Its per-row constant does
  not change its softmax, only its log-sum-exp (lse + row_i); its per-key constant rides on one extra
  column, (q_i / sqrt(d), 1) . (k_j, key_j).

The parts merge by log-sum-exp: with w_p = exp(lse_p - lse), out = sum_p w_p out_p. The fused calls do
about the n^2 d work of one plain attention between them, the windows n (S + 2r) d.

Backward (the flash-attention identities, dS_ij = P_ij (dO_i . v_j - D_i), D_i = dO_i . O_i): the
fused backward kernel of a part, fed the *merged* output O and log-sum-exp (minus its row constant),
computes P_ij and so dS_ij exactly, with no log-sum-exp gradient; the row constant's gradient is
sum_{j in part} dS_ij = w_p (dO_i . O^p_i - D_i).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

flash_forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
SIDES = ("left", "right")


def _acc(x: Tensor) -> torch.dtype:
    """Softmax statistics in float32 for float32 / bfloat16 inputs, float64 for float64."""
    return torch.promote_types(x.dtype, torch.float32)


def block_size(reach: int) -> int:
    """Queries per block: wider windows cost explicit work (S + 2r per query) and memory (the window
    tensors), narrower ones more fused calls (2 n / S). One layer, 2 threads (issue 11): S = 128 beat 64
    and 256 at n = 512 (composite 1.36x plain SDPA's time against 1.40x and 1.41x, composite+key 1.65x
    against 1.86x and 1.72x); at n = 2048 S = 256 was faster (1.26x against 1.37x), but at n = 8192 it
    took 1.39x plain SDPA's peak memory against 1.29x."""
    return max(2 * reach, 128)


class _Windows:
    """Query block b (rows bS .. bS + S - 1) against its key window (rows bS - r .. bS + S + r - 1).
    Entry [a, c] pairs query i = bS + a with key j = bS - r + c: on the band where 0 <= c - a <= 2r
    (band column t = c - a), left of it where c < a, right of it where c > a + 2r. S >= 2r, so a
    window overlaps only the next block's first 2r rows."""

    def __init__(self, n: int, reach: int):
        self.n, self.reach, self.width = n, reach, 2 * reach + 1
        self.size = block_size(reach)
        self.count = -(-n // self.size)
        self.padded = self.count * self.size

    def queries(self, block: int) -> slice:
        return slice(block * self.size, min((block + 1) * self.size, self.n))

    def keys(self, block: int, side: str) -> slice:
        """The keys of a block's fused call: left or right of its window (possibly empty)."""
        start = block * self.size
        if side == "left":
            return slice(0, max(start - self.reach, 0))
        return slice(min(start + self.size + self.reach, self.n), self.n)

    def blocks(self, x: Tensor, fill: float = 0.0) -> Tensor:
        """(..., n, c) -> (..., blocks, S, c), rows past n filled."""
        if self.padded > self.n:
            x = F.pad(x, (0, 0, 0, self.padded - self.n), value=fill)
        return x.unflatten(-2, (self.count, self.size))

    def windows(self, x: Tensor) -> Tensor:
        """(..., n, c) -> contiguous (..., blocks, S + 2r, c), the keys each query block's window holds (0 past
        the ends): block b's own rows, the last r rows of block b - 1 before them and the first r of b + 1 after."""
        size, reach = self.size, self.reach
        rows = self.blocks(x)
        out = rows.new_empty(*rows.shape[:-2], size + 2 * reach, rows.shape[-1])
        out[..., reach:reach + size, :] = rows
        out[..., 1:, :reach, :] = rows[..., :-1, size - reach:, :]
        out[..., :-1, size + reach:, :] = rows[..., 1:, :reach, :]
        out[..., 0, :reach, :] = 0
        out[..., -1, size + reach:, :] = 0
        return out

    def fold(self, grad_windows: Tensor) -> Tensor:
        """Adjoint of `windows`: (..., blocks, S + 2r, c) -> (..., n, c), overlaps summed."""
        size, reach = self.size, self.reach
        grad = grad_windows[..., reach:reach + size, :].clone()
        grad[..., :-1, size - reach:, :] += grad_windows[..., 1:, :reach, :]
        grad[..., 1:, :reach, :] += grad_windows[..., :-1, size + reach:, :]
        return self.unblock(grad)

    def band(self, scores: Tensor) -> Tensor:
        """(..., blocks, S, S + 2r) contiguous -> view (..., blocks, S, 2r + 1) of entries [a, a + t]."""
        stride = list(scores.stride())
        stride[-2] += 1
        return scores.as_strided((*scores.shape[:-1], self.width), stride, scores.storage_offset())

    def unblock(self, x: Tensor) -> Tensor:
        """(..., blocks, S, ...) -> (..., n, ...)."""
        return x.flatten(-3, -2)[..., :self.n, :] if x.dim() > 4 else x.flatten(-2)[..., :self.n]

    def sides(self, device) -> dict[str, Tensor]:
        """(S, S + 2r) bool: the window entries left and right of the band."""
        a = torch.arange(self.size, device=device)[:, None]
        c = torch.arange(self.size + 2 * self.reach, device=device)
        return {"left": c < a, "right": c > a + 2 * self.reach}

    def row_sums(self, x: Tensor) -> Tensor:
        """(..., blocks, S, S + 2r) -> (..., n): sum over each query's window."""
        return self.unblock(x.sum(-1))

    def key_sums(self, x: Tensor) -> Tensor:
        """(..., blocks, S, S + 2r) -> (..., n): sum over each key's queries, all windows."""
        return self.fold(x.sum(-2)[..., None])[..., 0]

    def off_band_sums(self, grad_scores: Tensor, rows: bool, keys: bool) -> tuple[dict, dict]:
        """Sums of dS beside the band within the windows: per query row left of it (`rows`), per key left
        and right of it (`keys`). Consumes grad_scores (zeroed in place, so no window-sized temporary)."""
        grad_rows, grad_keys = {}, {}
        self.band(grad_scores).zero_()
        both_sides = self.key_sums(grad_scores) if keys else None
        grad_scores.masked_fill_(self.sides(grad_scores.device)["right"], 0.0)  # left of the band remains
        if rows:
            grad_rows["left"] = self.row_sums(grad_scores)
        if keys:
            grad_keys["left"] = self.key_sums(grad_scores)
            grad_keys["right"] = both_sides - grad_keys["left"]
        return grad_rows, grad_keys

    def scores(self, q_scaled: Tensor, k: Tensor, band: Tensor, rows: dict, keys: dict, keep: Tensor | None) -> Tensor:
        """(batch, heads, blocks, S, S + 2r) scores in the accumulation dtype: the band's bias on the band,
        the off-band constants beside it, -inf at missing or pad keys."""
        q_blocks, k_windows = self.blocks(q_scaled), self.windows(k)
        shape, acc = (*q_blocks.shape[:-1], k_windows.shape[-2]), _acc(q_scaled)
        if rows["left"] is not None:
            # the per-row bias of every window entry in one gather: [row_left, band, row_right][i, c - a + 1]
            table = torch.cat([rows["left"][..., None], band, rows["right"][..., None]], -1).to(acc)
            column = (torch.arange(self.size + 2 * self.reach, device=k.device)
                      - torch.arange(self.size, device=k.device)[:, None] + 1).clamp_(0, self.width + 1)
            scores = torch.gather(self.blocks(table), -1, column.expand(shape))
        else:
            scores = torch.zeros(shape, dtype=acc, device=k.device)
            self.band(scores).add_(self.blocks(band.to(acc)))
        if acc == q_scaled.dtype:  # the score product accumulates into the bias, no extra pass
            scores.flatten(0, -3).baddbmm_(q_blocks.flatten(0, -3), k_windows.flatten(0, -3).transpose(-1, -2))
        else:
            scores += torch.matmul(q_blocks, k_windows.transpose(-1, -2)).to(acc)
        for side, inside in self.sides(k.device).items():
            if keys[side] is not None:
                bias = self.windows(keys[side][..., None].to(scores.dtype)).transpose(-1, -2)
                scores += bias.masked_fill(~inside, 0.0)
        exists = torch.ones(1, self.n, dtype=torch.uint8, device=k.device) if keep is None else keep.to(torch.uint8)
        missing = self.windows(exists[:, None, :, None]).transpose(-1, -2) == 0
        return scores.masked_fill_(missing, float("-inf"))


def _pad_mask(keep: Tensor | None, keys: slice, dtype: torch.dtype) -> Tensor | None:
    """Additive (batch, 1, 1, keys) mask of a fused call's pad keys (finite, so an all-pad part gets a
    finite log-sum-exp and weight exp(lse_p - lse) = 0)."""
    if keep is None:
        return None
    mask = torch.zeros(keep[:, keys].shape, dtype=dtype, device=keep.device)
    return mask.masked_fill(~keep[:, keys], torch.finfo(dtype).min)[:, None, None, :]


class _Augmented:
    """q / sqrt(d), k, v for the fused calls; with key terms one extra column carries them:
    (q / sqrt(d), 1) . (k, key_j), v padded with a zero column to the same head size."""

    def __init__(self, q_scaled: Tensor, k: Tensor, v: Tensor, keys: dict):
        self.with_key = keys["left"] is not None
        if self.with_key:
            self.q = torch.cat([q_scaled, q_scaled.new_ones(*q_scaled.shape[:-1], 1)], -1)
            self.k = {side: torch.cat([k, keys[side][..., None].to(k.dtype)], -1) for side in SIDES}
            self.v = _widen(v)
        else:
            self.q, self.k, self.v = q_scaled, {side: k for side in SIDES}, v


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
        acc = _acc(q)
        rows, keys = {"left": row_left, "right": row_right}, {"left": key_left, "right": key_right}
        windows = _Windows(n, reach)
        # heads come as (batch, n, heads, d) strided views: the window matmuls want q contiguous (k and v
        # are copied into windows, and the fused kernel takes strides)
        q_scaled = torch.mul(q, d ** -0.5, out=torch.empty(q.shape, dtype=q.dtype, device=q.device))
        scores = windows.scores(q_scaled, k, band, rows, keys, keep)
        # the window's softmax statistics; its unnormalised probabilities overwrite the scores
        top = scores.amax(-1, keepdim=True).nan_to_num_(neginf=0.0)
        unnormalised = scores.sub_(top).exp_()
        lse = windows.unblock((top + unnormalised.sum(-1, keepdim=True).log())[..., 0])
        augmented = _Augmented(q_scaled, k, v, keys)
        side_out = {side: q.new_zeros(*q.shape) for side in SIDES}
        side_lse = {side: torch.full(lse.shape, float("-inf"), dtype=acc, device=q.device) for side in SIDES}
        for block in range(windows.count):
            queries = windows.queries(block)
            for side in SIDES:
                part = windows.keys(block, side)
                if part.start == part.stop:
                    continue
                out_p, lse_p = flash_forward(augmented.q[..., queries, :], augmented.k[side][..., part, :],
                                             augmented.v[..., part, :], attn_mask=_pad_mask(keep, part, q.dtype),
                                             scale=1.0)
                side_out[side][..., queries, :] = out_p[..., :d]
                side_lse[side][..., queries] = lse_p
        for side in SIDES:
            if rows[side] is not None:
                side_lse[side] += rows[side].to(acc)
            lse = torch.logaddexp(lse, side_lse[side])
        probs = unnormalised.mul_(torch.exp(top - windows.blocks(lse[..., None])))
        out = windows.unblock(torch.matmul(probs.to(v.dtype), windows.windows(v))).to(acc)
        for side in SIDES:
            out.addcmul_(torch.exp(side_lse[side] - lse)[..., None], side_out[side].to(acc))
        out = out.to(q.dtype)
        # the row terms' gradients need the left parts' own outputs and log-sum-exp (see backward)
        left_out, left_lse = (side_out["left"], side_lse["left"]) if row_left is not None else (None, None)
        ctx.save_for_backward(q_scaled, k, v, band, row_left, row_right, key_left, key_right, keep, out, lse,
                              probs, left_out, left_lse)
        ctx.reach = reach
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q_scaled, k, v, band, row_left, row_right, key_left, key_right, keep, out, lse, probs, left_out, left_lse = (
            ctx.saved_tensors)
        q = q_scaled
        reach, n, d = ctx.reach, q.shape[-2], q.shape[-1]
        acc, scale = _acc(q), d ** -0.5
        rows, keys = {"left": row_left, "right": row_right}, {"left": key_left, "right": key_right}
        grad_out = grad_out.contiguous()
        dout = grad_out.to(acc)
        row_term = (dout * out.to(acc)).sum(-1)  # D_i = dO_i . O_i
        windows = _Windows(n, reach)
        dout_blocks = windows.blocks(grad_out)
        grad_scores = torch.matmul(dout_blocks, windows.windows(v).transpose(-1, -2)).to(acc)  # dP, then dS in place
        grad_scores.sub_(windows.blocks(row_term[..., None])).mul_(probs)
        grad_band = windows.unblock(windows.band(grad_scores)).clone()  # grad_scores is reused below
        ds = grad_scores.to(q.dtype)
        grad_q = windows.unblock(torch.matmul(ds, windows.windows(k))).to(acc) * scale
        grad_k = windows.fold(torch.matmul(ds.transpose(-1, -2), windows.blocks(q_scaled))).to(acc)
        grad_v = windows.fold(torch.matmul(probs.to(v.dtype).transpose(-1, -2), dout_blocks)).to(acc)
        del ds, dout_blocks
        # the off-band constants' gradients: sums of dS beside the band, per query row (left side only,
        # the right one follows from sum_j dS_ij = 0, below) and per key
        grad_rows, grad_keys = windows.off_band_sums(grad_scores, row_left is not None, key_left is not None)
        del grad_scores
        augmented = _Augmented(q_scaled, k, v, keys)
        grad_part, out_part = (_widen(grad_out), _widen(out)) if augmented.with_key else (grad_out, out)
        # the kernel's P_ij = exp(s_ij - lse_i) with the merged lse minus the row constant it never saw
        kernel_lse = {side: (lse if rows[side] is None else lse - rows[side].to(acc)).contiguous() for side in SIDES}
        for block in range(windows.count):
            queries = windows.queries(block)
            for side in SIDES:
                part = windows.keys(block, side)
                if part.start == part.stop:
                    continue
                gq, gk, gv = flash_backward(
                    grad_part[..., queries, :], augmented.q[..., queries, :], augmented.k[side][..., part, :],
                    augmented.v[..., part, :], out_part[..., queries, :], kernel_lse[side][..., queries],
                    0.0, False, attn_mask=_pad_mask(keep, part, q.dtype), scale=1.0)
                grad_q[..., queries, :] += gq[..., :d].to(acc) * scale
                grad_k[..., part, :] += gk[..., :d].to(acc)
                grad_v[..., part, :] += gv[..., :d].to(acc)
                if keys[side] is not None:
                    grad_keys[side][..., part] += gk[..., d].to(acc)
        if row_left is not None:
            # the left fused parts add w_p (dO_i . O^p_i - D_i); the right side's sum is minus the band's and the left's
            left_fused = torch.exp(left_lse - lse) * ((dout * left_out.to(acc)).sum(-1) - row_term)
            grad_rows["left"] = grad_rows["left"] + left_fused
            grad_rows["right"] = -(grad_band.sum(-1) + grad_rows["left"]) * (torch.arange(n, device=q.device) < n - reach - 1)
        return (grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), grad_band.to(band.dtype),
                grad_rows.get("left"), grad_rows.get("right"), grad_keys.get("left"), grad_keys.get("right"),
                None, None)


# Below this length the dense bias with SDPA's math kernel is faster on CPU (one attention layer, 2
# threads, forward+backward vs plain SDPA, composite / composite+key: n = 256 dense 1.56x / 1.72x,
# banded 1.87x / 2.00x; n = 512 dense 2.05x / 2.37x, banded 1.61x / 1.88x; benchmarks/RESULTS.md,
# issue 11): short sequences have few blocks, so the windows are most of the work.
BANDED_MIN_LENGTH = 512


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
