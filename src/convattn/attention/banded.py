"""Exact attention with relative-position scores, never holding an n x n bias or probability matrix.

Relative terms (relative.py) give the score s_ij = q_i . k_j / sqrt(d) + b_ij where b_ij depends on
i, j only through a table column c(j - i): b_ij = band[i, j - i + r] on the band |j - i| <= r, and off
it, in "clip" mode, a constant per query row plus one per key, different left (j < i - r) and right
(j > i + r) of the band; in "zero" mode b_ij = 0 off the band.

Queries go in blocks of S rows; block [s, s + S) meets the band only in keys [s - r, s + S + r), its
window. Each block's keys split into three parts:

* the window, explicit: a dense (S x (S + 2r)) matmul added to the bias (row_left left of the band,
  the band, row_right right of it); the per-key constants and the padding ride on one extra column of q and
  k, (q_i, 1) . (k_j, sqrt(d) key_right_j or -max), with left of the band corrected by
  key_left_j - key_right_j (and the band by -key_right_j);
* the keys left of the window, [0, s - r), and right of it, [s + S + r, n): off the band for every query
  of the block, so each side is one rectangular call of the CPU flash kernel. Its per-row constant does
  not change its softmax, only its log-sum-exp (lse + row_i); its per-key constant rides on one extra
  column, (q_i, 1) . (k_j, sqrt(d) key_j).

The parts merge by log-sum-exp: with w_p = exp(lse_p - lse), out = sum_p w_p out_p. The windows keep
their probabilities unnormalised, U = exp(s - max_row), O(n (S + 2r)) in all, and the normalisation
f = exp(max_row - lse) is applied to the (n x d) rows they touch: U V f in forward, and in backward
dS = U (f dO V^T - f D), dV = U^T (f dO).

Backward (the flash-attention identities, dS_ij = P_ij (dO_i . v_j - D_i), D_i = dO_i . O_i): the
fused backward kernel of a part, fed the *merged* output O and log-sum-exp (minus its row constant),
computes P_ij and so dS_ij exactly, with no log-sum-exp gradient; the row constant's gradient is
sum_{j in part} dS_ij = w_p (dO_i . O^p_i - D_i), a key constant's the kernel's gradient of its column.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

flash_forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
SIDES = ("left", "right")
# The windows are computed a chunk of (batch, head, block) groups at a time, each chunk's score tensor
# about this size: small enough to stay in cache between the passes over it and for the allocator to
# reuse (glibc maps anything above 32 MiB afresh, page faults and all, on every call). Forward keeps
# each chunk's probabilities for backward (recomputing them cost a third of the backward's time).
WINDOW_CHUNK_BYTES = 4 << 20


def _acc(x: Tensor) -> torch.dtype:
    """Softmax statistics in float32 for float32 / bfloat16 inputs, float64 for float64."""
    return torch.promote_types(x.dtype, torch.float32)


def block_size(n: int, reach: int) -> int:
    """Queries per block. The CPU flash kernel splits a call's queries into tiles of 32 below 192 queries
    and of 64 from there, and its cost per score falls by about a quarter between the two (measured
    at 2 threads, issue 11); wider windows cost explicit work (S + 2r keys per query) and memory. The
    attention alone, composite, forward + backward, 2 threads, against plain SDPA: S = 256 beat 192 at
    n = 512 (1.51x against 1.67x) and 384 and 512 at n = 2048 (1.27x against 1.39x and 1.33x); in one layer
    an earlier version took 1.32x with S = 256 against 1.50x with 128 at n = 512."""
    return max(2 * reach, min(n, 256))


class _Windows:
    """Query block b (rows bS .. bS + S - 1) against its key window (rows bS - r .. bS + S + r - 1).
    Entry [a, c] pairs query i = bS + a with key j = bS - r + c: on the band where 0 <= c - a <= 2r
    (band column t = c - a), left of it where c < a, right of it where c > a + 2r. S >= 2r, so a
    window overlaps only the next block's first 2r rows."""

    def __init__(self, n: int, reach: int):
        self.n, self.reach, self.width = n, reach, 2 * reach + 1
        self.size = block_size(n, reach)
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

    def fused_calls(self):
        """(side, queries, keys) of every fused call with keys."""
        for block in range(self.count):
            for side in SIDES:
                keys = self.keys(block, side)
                if keys.start < keys.stop:
                    yield side, self.queries(block), keys

    def blocks(self, x: Tensor) -> Tensor:
        """(..., n, c) -> (..., blocks, S, c), rows past n zero."""
        if self.padded > self.n:
            x = F.pad(x, (0, 0, 0, self.padded - self.n))
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

    def groups(self, x: Tensor) -> Tensor:
        """(batch, heads, n, c) -> (groups, S, c), groups = (batch, head, block) flattened."""
        return self.blocks(x).flatten(0, -3)

    def ungroup(self, x: Tensor, heads_shape: torch.Size) -> Tensor:
        """Inverse of `groups`: (groups, S, ...) -> (batch, heads, n, ...); heads_shape = (batch, heads)."""
        return self.unblock(x.view(*heads_shape, self.count, *x.shape[1:]))

    def left_of_band(self, device, dtype) -> Tensor:
        """(S, S + 2r): 1 at the window entries left of the band, else 0."""
        a = torch.arange(self.size, device=device)[:, None]
        return (torch.arange(self.size + 2 * self.reach, device=device) < a).to(dtype)

    def hide_missing(self, key_windows: Tensor, column: int) -> None:
        """Write -max into `column` of the window rows past either end of the sequence (past the end: the
        last block's window, and the one before if the last block has fewer than r rows)."""
        lowest = torch.finfo(key_windows.dtype).min
        key_windows[..., 0, :self.reach, column] = lowest
        for block in range(self.count - 1, -1, -1):
            past_end = self.n - block * self.size + self.reach
            if past_end >= self.size + 2 * self.reach:
                break
            key_windows[..., block, past_end:, column] = lowest


def _band_keys(x: Tensor, reach: int) -> Tensor:
    """(..., n) per-key values -> (..., n, 2r + 1) with key i + t - r's value at [i, t], 0 past the ends."""
    return F.pad(x, (reach, reach)).unfold(-1, 2 * reach + 1, 1)


def _band_key_sums(grad_band: Tensor, reach: int) -> Tensor:
    """Adjoint of `_band_keys`: (..., n, 2r + 1) -> (..., n), each key's entries summed."""
    n = grad_band.shape[-2]
    sums = grad_band.new_zeros(*grad_band.shape[:-2], n + 2 * reach)
    for t in range(2 * reach + 1):
        sums[..., t:t + n] += grad_band[..., t]
    return sums[..., reach:reach + n]


class _Operands:
    """q, k, v laid out for the window matmuls and the fused calls. Queries carry a column of ones and
    keys a column holding sqrt(d) times a key constant, or -max at pad keys: (q_i, 1) . (k_j, c_j) / sqrt(d)
    adds c_j / sqrt(d). Without key constants: [q, 1], [k, pad] and v; the fused calls take the first d
    columns and mask pads with `attn_mask`. With them: [1, q, 1], [sqrt(d) key_left, k, sqrt(d) key_right]
    and [0, v, 0]; the left calls take columns 0 .. d, the right ones and the windows 1 .. d + 1."""

    def __init__(self, q: Tensor, k: Tensor, with_key: bool, keep: Tensor | None):
        self.q, self.k, self.with_key, self.keep = q, k, with_key, keep
        self.d = q.shape[-1] - (2 if with_key else 1)
        tail = slice(1, None) if with_key else slice(None)
        self.window_queries, self.window_keys = q[..., tail], k[..., tail]

    @classmethod
    def build(cls, q: Tensor, k: Tensor, key_left: Tensor | None, key_right: Tensor | None,
              keep: Tensor | None) -> _Operands:
        d, with_key = q.shape[-1], key_left is not None
        lowest, root = torch.finfo(q.dtype).min, d ** 0.5

        def column(key: Tensor | None) -> Tensor:
            values = k.new_zeros(k.shape[:-1]) if key is None else (key * root).to(k.dtype)
            return values if keep is None else values.masked_fill(~keep[:, None, :], lowest)

        q_buffer = q.new_empty(*q.shape[:-1], d + (2 if with_key else 1))
        k_buffer = k.new_empty(q_buffer.shape)
        first = 1 if with_key else 0
        q_buffer[..., first:first + d] = q
        k_buffer[..., first:first + d] = k
        q_buffer[..., -1] = 1
        k_buffer[..., -1] = column(key_right)
        if with_key:
            q_buffer[..., 0] = 1
            k_buffer[..., 0] = column(key_left)
        return cls(q_buffer, k_buffer, with_key, keep)

    def side(self, x: Tensor, side: str) -> Tensor:
        """A (..., width) buffer as one side's fused call takes it."""
        if not self.with_key:
            return x[..., :self.d]
        return x[..., :self.d + 1] if side == "left" else x[..., 1:]

    def main(self, x: Tensor, side: str) -> Tensor:
        """The d head columns of a fused call's output or gradient."""
        return x[..., 1:] if self.with_key and side == "left" else x[..., :self.d]

    def constant(self, x: Tensor, side: str) -> Tensor:
        """The key-constant column of a fused call's key gradient."""
        return x[..., 0] if side == "left" else x[..., self.d]

    def widen(self, x: Tensor) -> Tensor:
        """v, O or dO as the fused calls take them: [0, x, 0] with key constants."""
        return F.pad(x, (1, 1)) if self.with_key else x

    def pad_mask(self, keys: slice) -> Tensor | None:
        """Additive (batch, 1, 1, keys) mask of a fused call's pad keys (finite, so an all-pad part gets a
        finite log-sum-exp and weight exp(lse_p - lse) = 0); with key constants the column masks them."""
        if self.keep is None or self.with_key:
            return None
        keep = self.keep[:, keys]
        mask = torch.zeros(keep.shape, dtype=self.q.dtype, device=keep.device)
        return mask.masked_fill(~keep, torch.finfo(self.q.dtype).min)[:, None, None, :]


class _WindowTerms:
    """Everything the windows' scores need, flattened to groups g = (batch, head, block): query rows
    (g, S, d + 1) with their column of ones, key rows (g, S + 2r, d + 1) with the key column (-max past the
    ends), value rows (g, S + 2r, d), the band (g, S, 2r + 1), the row constants (g, S) and key_left -
    key_right (g, S + 2r). `scores` builds a chunk of groups at a time."""

    def __init__(self, windows: _Windows, operands: _Operands, v: Tensor, band: Tensor, rows: dict, keys: dict):
        self.windows, self.d, self.acc = windows, operands.d, _acc(band)
        self.queries = windows.groups(operands.window_queries)
        key_windows = windows.windows(operands.window_keys)
        windows.hide_missing(key_windows, self.d)
        self.keys, self.values = key_windows.flatten(0, -3), windows.windows(v).flatten(0, -3)
        if keys["right"] is not None:
            band = band - _band_keys(keys["right"], windows.reach)  # the key column adds key_right to the band too
        self.band = windows.groups(band.to(self.acc))
        self.rows = None
        if rows["left"] is not None:
            self.rows = [windows.groups(rows[side][..., None].to(self.acc)) for side in SIDES]
        self.key_shift = None
        if keys["left"] is not None:
            shift = (keys["left"] - keys["right"])[..., None].to(self.acc)
            self.key_shift = windows.windows(shift).flatten(0, -3).mT
        self.left = windows.left_of_band(band.device, torch.bool)
        self.left_weight = self.left.to(self.acc)
        self.count, size = self.queries.shape[0], windows.size * (windows.size + 2 * windows.reach)
        self.chunk = max(1, WINDOW_CHUNK_BYTES // (size * torch.finfo(self.acc).bits // 8))

    def chunks(self) -> list[slice]:
        return [slice(start, min(start + self.chunk, self.count)) for start in range(0, self.count, self.chunk)]

    def scores(self, chunk: slice) -> Tensor:
        """(groups, S, S + 2r) scores in the accumulation dtype: row constants beside the band, the band's
        bias on it, q . k / sqrt(d) and the key column by one matmul (which also hides missing and pad keys),
        and key_left - key_right left of the band."""
        q, k = self.queries[chunk], self.keys[chunk]
        shape = (q.shape[0], q.shape[1], k.shape[1])
        if self.rows is not None:
            scores = torch.where(self.left, self.rows[0][chunk], self.rows[1][chunk])
        else:
            scores = torch.zeros(shape, dtype=self.acc, device=q.device)
        self.windows.band(scores).copy_(self.band[chunk])
        if self.acc == q.dtype:  # the score product accumulates into the bias, no extra pass
            scores.baddbmm_(q, k.mT, alpha=self.d ** -0.5)
        else:
            scores += torch.matmul(q, k.mT).to(self.acc) * self.d ** -0.5
        if self.key_shift is not None:
            scores.addcmul_(self.left_weight, self.key_shift[chunk])
        return scores


class BandedRelativeAttention(torch.autograd.Function):
    """softmax(q k^T / sqrt(d) + relative bias + padding mask) v (see the module docstring).

    q, k, v: (batch, heads, n, d); band: (batch, heads, n, 2r + 1), the bias of key i + t - r at [i, t];
    row_*: (batch, heads, n) or None, the off-band bias per query row; key_*: (batch, heads, n) or
    None, per key; keep: (batch, n) bool or None.
    """

    @staticmethod
    def forward(ctx, q, k, v, band, row_left, row_right, key_left, key_right, keep, reach):
        n, d = q.shape[-2], q.shape[-1]
        acc, scale = _acc(q), d ** -0.5
        rows, keys = {"left": row_left, "right": row_right}, {"left": key_left, "right": key_right}
        windows = _Windows(n, reach)
        operands = _Operands.build(q, k, key_left, key_right, keep)
        terms = _WindowTerms(windows, operands, v, band, rows, keys)
        # the windows, a chunk of groups at a time: U = exp(s - max_row), kept for backward, and U V
        window_out = q.new_empty(*terms.queries.shape[:-1], d)
        top = torch.empty(terms.queries.shape[:-1], dtype=acc, device=q.device)
        window_lse = torch.empty_like(top)
        kept = []
        for chunk in terms.chunks():
            scores = terms.scores(chunk)
            top[chunk] = scores.amax(-1)
            unnormalised = scores.sub_(top[chunk, :, None]).exp_()
            window_lse[chunk] = top[chunk] + unnormalised.sum(-1).log()
            torch.matmul(unnormalised.to(v.dtype), terms.values[chunk], out=window_out[chunk])
            kept.append(unnormalised)
        del scores, unnormalised
        heads_shape = q.shape[:-2]
        lse = windows.ungroup(window_lse, heads_shape)
        values = operands.widen(v)
        side_out = {side: q.new_zeros(q.shape) for side in SIDES}
        side_lse = {side: torch.full(lse.shape, float("-inf"), dtype=acc, device=q.device) for side in SIDES}
        for side, queries, part in windows.fused_calls():
            out_p, lse_p = flash_forward(
                operands.side(operands.q, side)[..., queries, :], operands.side(operands.k, side)[..., part, :],
                operands.side(values, side)[..., part, :], attn_mask=operands.pad_mask(part), scale=scale)
            side_out[side][..., queries, :] = operands.main(out_p, side)
            side_lse[side][..., queries] = lse_p
        for side in SIDES:
            if rows[side] is not None:
                side_lse[side] += rows[side].to(acc)
            lse = torch.logaddexp(lse, side_lse[side])
        window_scale = torch.exp(top - windows.groups(lse[..., None])[..., 0])  # exp(max_row - lse): U -> P
        out = windows.ungroup(window_out, heads_shape).to(acc)
        out *= windows.ungroup(window_scale, heads_shape)[..., None]
        for side in SIDES:
            out.addcmul_(torch.exp(side_lse[side] - lse)[..., None], side_out[side].to(acc))
        out = out.to(q.dtype)
        # the row terms' gradients need the left parts' own outputs and log-sum-exp (see backward)
        left_out, left_lse = (side_out["left"], side_lse["left"]) if row_left is not None else (None, None)
        ctx.save_for_backward(v, row_left, row_right, out, lse, left_out, left_lse)
        ctx.operands, ctx.terms, ctx.reach, ctx.kept, ctx.window_scale = operands, terms, reach, kept, window_scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        v, row_left, row_right, out, lse, left_out, left_lse = ctx.saved_tensors
        operands, terms, reach = ctx.operands, ctx.terms, ctx.reach
        n, d = out.shape[-2], out.shape[-1]
        acc, scale = _acc(out), d ** -0.5
        rows = {"left": row_left, "right": row_right}
        has_rows, has_keys = row_left is not None, terms.key_shift is not None
        windows = _Windows(n, reach)
        grad_out = grad_out.contiguous()
        row_term = (grad_out.to(acc) * out.to(acc)).sum(-1)  # D_i = dO_i . O_i
        # the windows: dS = P (dO V^T - D) and dV = P^T dO with P = U f, f = exp(max_row - lse) moved onto dO and D
        scaled_grad = windows.groups(grad_out) * ctx.window_scale[..., None].to(grad_out.dtype)
        scaled_row_term = windows.groups(row_term[..., None]) * ctx.window_scale[..., None]
        grad_band = torch.empty(terms.band.shape, dtype=acc, device=out.device)
        grad_q = out.new_empty(*terms.queries.shape[:-1], d)
        grad_keys_window = out.new_empty(terms.keys.shape)
        grad_v = out.new_empty(terms.values.shape)
        left_rows = torch.empty(terms.queries.shape[:-1], dtype=acc, device=out.device) if has_rows else None
        left_keys = torch.empty(terms.keys.shape[:-1], dtype=acc, device=out.device) if has_keys else None
        for chunk, unnormalised in zip(terms.chunks(), ctx.kept, strict=True):
            grad_scores = torch.matmul(scaled_grad[chunk], terms.values[chunk].mT).to(acc)
            grad_scores.sub_(scaled_row_term[chunk]).mul_(unnormalised)
            grad_band[chunk] = windows.band(grad_scores)
            ds = grad_scores.to(out.dtype)
            torch.matmul(ds, terms.keys[chunk][..., :d], out=grad_q[chunk])
            # the queries' column of ones makes the key gradient's last column each key's sum of dS
            torch.matmul(ds.mT, terms.queries[chunk], out=grad_keys_window[chunk])
            torch.matmul(unnormalised.to(out.dtype).mT, scaled_grad[chunk], out=grad_v[chunk])
            if has_rows or has_keys:  # sums of dS left of the band, per query row and per key
                grad_scores.mul_(terms.left_weight)
                if has_rows:
                    left_rows[chunk] = grad_scores.sum(-1)
                if has_keys:
                    left_keys[chunk] = grad_scores.sum(-2)
        del unnormalised, grad_scores, ds
        heads_shape = out.shape[:-2]
        window_shape = (*heads_shape, windows.count)  # (batch, heads, blocks): key windows fold, not ungroup
        grad_band = windows.ungroup(grad_band, heads_shape)
        grad_q = windows.ungroup(grad_q, heads_shape).to(acc).mul_(scale)
        grad_keys_window = windows.fold(grad_keys_window.view(*window_shape, *terms.keys.shape[1:])).to(acc)
        grad_k = grad_keys_window[..., :d].mul_(scale)
        grad_v = windows.fold(grad_v.view(*window_shape, *terms.values.shape[1:])).to(acc)
        ctx.kept = ctx.terms = terms = None  # the windows are done with: free them before the fused calls
        if has_rows:
            left_rows = windows.ungroup(left_rows, heads_shape)
        if has_keys:
            left_keys = windows.fold(left_keys.view(*window_shape, -1, 1))[..., 0]
        grad_key = {side: torch.zeros(lse.shape, dtype=acc, device=lse.device) for side in SIDES} if has_keys else {}
        grad_part, out_part, values = operands.widen(grad_out), operands.widen(out), operands.widen(v)
        # the kernel's P_ij = exp(s_ij - lse_i) with the merged lse minus the row constant it never saw
        kernel_lse = {side: (lse if rows[side] is None else lse - rows[side].to(acc)).contiguous() for side in SIDES}
        for side, queries, part in windows.fused_calls():
            gq, gk, gv = flash_backward(
                operands.side(grad_part, side)[..., queries, :], operands.side(operands.q, side)[..., queries, :],
                operands.side(operands.k, side)[..., part, :], operands.side(values, side)[..., part, :],
                operands.side(out_part, side)[..., queries, :], kernel_lse[side][..., queries], 0.0, False,
                attn_mask=operands.pad_mask(part), scale=scale)
            grad_q[..., queries, :] += operands.main(gq, side)
            grad_k[..., part, :] += operands.main(gk, side)
            grad_v[..., part, :] += operands.main(gv, side)
            if has_keys:
                grad_key[side][..., part] += operands.constant(gk, side) * d ** 0.5
        grad_rows = {}
        if has_rows:
            # the left fused parts add w_p (dO_i . O^p_i - D_i); the right side's sum is minus the band's
            # and the left's, since sum_j dS_ij = 0
            left_fused = torch.exp(left_lse - lse) * ((grad_out.to(acc) * left_out.to(acc)).sum(-1) - row_term)
            grad_rows["left"] = left_rows + left_fused
            has_right = torch.arange(n, device=lse.device) < n - reach - 1
            grad_rows["right"] = -(grad_band.sum(-1) + grad_rows["left"]) * has_right
        if has_keys:
            # in the windows key_right came with every entry, taken back on the band and left of it
            grad_key["left"] += left_keys
            grad_key["right"] += grad_keys_window[..., d] - _band_key_sums(grad_band, reach) - left_keys
        dtype = out.dtype
        return (grad_q.to(dtype), grad_k.to(dtype), grad_v.to(dtype), grad_band.to(dtype),
                *(grad_rows[side].to(dtype) if side in grad_rows else None for side in SIDES),
                *(grad_key[side].to(dtype) if side in grad_key else None for side in SIDES), None, None)


# Below this length the dense bias with SDPA's math kernel is as fast on CPU (one attention layer, 2
# threads, forward+backward vs plain SDPA, composite / composite+key, minimum of 7 steps: n = 64 dense
# 1.14x / 1.18x, banded 1.11x / 1.20x; n = 128 dense 1.16x / 1.33x, banded 1.24x / 1.33x; n = 256 dense
# 1.67x / 2.30x, banded 1.53x / 1.37x; issue 11) and the dense bias is small.
BANDED_MIN_LENGTH = 256


def takes_banded_path(q: Tensor, backend: str, dropout_p: float, need_weights: bool) -> bool:
    """The banded path serves "sdpa" on CPU from BANDED_MIN_LENGTH tokens on. It cannot drop
    probabilities (the fused CPU kernel has no dropout it could replay in backward: blockwise.py does) nor
    return them (the dense bias does), and a graph being traced by torch.export / ONNX keeps the dense bias
    (the length test would pin the dynamic sequence axis to one side of BANDED_MIN_LENGTH)."""
    if torch.compiler.is_exporting():
        return False
    return (backend == "sdpa" and q.device.type == "cpu" and dropout_p == 0.0 and not need_weights
            and q.shape[-2] >= BANDED_MIN_LENGTH)


def banded_relative_attention(q, k, v, band, row_left, row_right, key_left, key_right, keep, reach) -> Tensor:
    return BandedRelativeAttention.apply(q, k, v, band.contiguous(), row_left, row_right, key_left, key_right,
                                         keep, reach)
