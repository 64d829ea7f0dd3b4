"""Exact attention with relative-position scores, never holding an n x n bias or probability matrix.

Relative terms (bias.py) give the score s_ij = q_i . k_j / sqrt(d) + b_ij where b_ij depends on i, j only
through a table column c(j - i): b_ij = band[i, j - i + r] on the band |j - i| <= r, and off it, in "clip"
mode, a constant per query row plus one per key, different left (j < i - r) and right (j > i + r) of the
band; in "zero" mode b_ij = 0 off the band.

Each query's keys split into a near part, computed explicitly, and the keys left and right of it, the far
parts, each computed by a fused kernel (kernels.py) that sees only constants there:

* a far part's per-row constant does not change its softmax, only its log-sum-exp (lse + row_i); its per-key
  constant (and, for kernels without a key mask, the padding) rides on one extra column of q and k,
  (q_i, 1) . (k_j, sqrt(d) key_j or -max) / sqrt(d), whose gradient is the constant's; constants that take no
  gradient (ALiBi's) ride on the key mask instead, where the kernel takes one, and the calls keep d channels;
* the near part is computed a block of S queries at a time against its window of keys [s - r, s + S + r),
  one dense (S x (S + 2r)) matmul. How far it reaches depends on the kernel's tiling. "causal": only the
  band; the far-left part is ONE causal call of queries r + 1 .. n - 1 against keys 0 .. n - r - 2 (query
  i sees key j < i - r) and the far-right part its mirror, so a kernel that skips masked blocks spends
  about one full attention on both. "blocks": the whole window, whose off-band entries carry their row
  constants (and, left of the band, key_left - key_right); the far parts are the keys left and right of
  the window, cut in rectangles that are off the band for every query they hold. They come in binary
  levels K = S, 2S, 4S, ...: in each pair of neighbouring K-blocks, the second's queries against the
  first's keys shifted left by r, and the first's queries against the second's keys shifted right by r. A
  query's far-left keys [0, s - r) are the union of its left rectangles over the levels, and a side's
  calls merge by log-sum-exp like the parts do. Long calls are the point: the CPU kernel tiles queries by
  256 from 768 queries on, by 64 below.

The parts merge by log-sum-exp (Milakov & Gimelshein 2018): with w_p = exp(lse_p - lse), out = sum_p w_p
out_p. The near part keeps its probabilities unnormalised, U = exp(s - max_row), and applies f = exp(max_row -
lse) to the (n x d) rows they touch: U V f in forward, and in backward dS = U (f dO V^T - f D), dV = U^T (f dO).
Dropout multiplies each normalised probability by a mask / (1 - p), so the merge stays exact: the near part
draws and keeps its mask, the kernels replay theirs from their random state.

Backward (FlashAttention's identities, Dao et al. 2022, Appendix B.2: dS_ij = P_ij (dP_ij - D_i),
D_i = dO_i . O_i): the fused backward of a far part, fed the *merged* output O and log-sum-exp (minus its
row constant), computes P_ij and so dS_ij exactly, with no log-sum-exp gradient and no atomics; the row
constant's gradient is sum_{j in part} dS_ij = w_p (dO_i . O^p_i - D_i), a key constant's the kernel's
gradient of its column.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from convattn.attention.relative.kernels import fused_kernel

SIDES = ("left", "right")
# The near part is computed a chunk of (batch, head, block) groups at a time, each chunk's score tensor
# about this size. On CPU: small enough to stay in cache between the passes over it and for the allocator to
# reuse (glibc maps anything above 32 MiB afresh, page faults and all, on every call). Forward keeps
# each chunk's probabilities for backward (recomputing them cost a third of the backward's time on CPU).
WINDOW_CHUNK_BYTES = 4 << 20
# On CUDA fewer, larger chunks launch fewer kernels; the scores of a chunk are transient (backward keeps the
# band alone there), so this bounds the extra peak memory. Not yet tuned on a GPU.
CUDA_WINDOW_CHUNK_BYTES = 16 << 20


def _by_side(left, right) -> dict:
    return dict(zip(SIDES, (left, right), strict=True))


def _acc(x: Tensor) -> torch.dtype:
    """Softmax statistics in float32 for float32 / bfloat16 / float16 inputs, float64 for float64."""
    return torch.promote_types(x.dtype, torch.float32)


def block_size(n: int, reach: int, tiling: str) -> int:
    """Queries per block. "blocks": the CPU kernel tiles a call's queries by 32 below 192 queries and by 64
    from there, and costs about a quarter less per score with 64; wider windows cost explicit work (S + 2r
    keys per query) and memory. S = 256 was the fastest of 64-256 at n = 512 (one composite layer, forward and
    backward: 1.52x plain SDPA's time; measure again by patching this function under python
    benchmarks/attention_layer.py). "causal": the window only carries the band, so narrow blocks waste least."""
    return max(2 * reach, min(n, 64 if tiling == "causal" else 256))


@dataclass(frozen=True)
class FusedCall:
    """One kernel call of a far part: `queries` against `keys`; causal on the left (query a of the call sees
    keys b <= a), anti-causal on the right (keys b >= a)."""

    side: str
    queries: slice
    keys: slice
    causal: bool


class Tiling:
    """Query block b (rows bS .. bS + S - 1) against its key window (rows bS - r .. bS + S + r - 1), and the
    fused calls of the far parts. Window entry [a, c] pairs query i = bS + a with key j = bS - r + c: on the
    band where 0 <= c - a <= 2r (band column t = c - a), left of it where c < a, right of it where c > a + 2r.
    S >= 2r, so a window overlaps only the next block's first 2r rows."""

    def __init__(self, n: int, reach: int, tiling: str):
        self.n, self.reach, self.width = n, reach, 2 * reach + 1
        self.band_only = tiling == "causal"
        self.size = block_size(n, reach, tiling)
        self.count = -(-n // self.size)
        self.padded = self.count * self.size

    def fused_calls(self):
        """Every fused call with keys: with "blocks" tiling, at every level K, one left and one right call for
        each pair of neighbouring K-blocks (module docstring)."""
        n, reach = self.n, self.reach
        if self.band_only:
            if n > reach + 1:
                yield FusedCall("left", slice(reach + 1, n), slice(0, n - reach - 1), True)
                yield FusedCall("right", slice(0, n - reach - 1), slice(reach + 1, n), True)
            return
        level = self.size
        while level < n:
            for first in range(0, n - level, 2 * level):
                second = first + level
                yield FusedCall("left", slice(second, min(second + level, n)),
                                slice(max(first - reach, 0), second - reach), False)
                if second + reach < n:
                    yield FusedCall("right", slice(first, second),
                                    slice(second + reach, min(second + level + reach, n)), False)
            level *= 2

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

    def left_of_band(self, device) -> Tensor:
        """(S, S + 2r) bool: the window entries left of the band."""
        a = torch.arange(self.size, device=device)[:, None]
        return torch.arange(self.size + 2 * self.reach, device=device) < a

    def off_band(self, device) -> Tensor:
        """(S, S + 2r) bool: the window entries off the band."""
        offset = (torch.arange(self.size + 2 * self.reach, device=device)
                  - torch.arange(self.size, device=device)[:, None])
        return (offset < 0) | (offset > 2 * self.reach)

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

    def compact(self, windows: Tensor) -> Tensor:
        """What backward keeps of a (groups, S, S + 2r) window tensor: the band alone where nothing else is
        nonzero ("causal" tiling), else all of it."""
        return self.band(windows).clone() if self.band_only else windows

    def expand(self, kept: Tensor) -> Tensor:
        """Inverse of `compact`."""
        if not self.band_only:
            return kept
        windows = kept.new_zeros(*kept.shape[:-1], self.size + 2 * self.reach)
        self.band(windows).copy_(kept)
        return windows


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
    columns (and mask pads with a key mask), or all d + 1 and v padded with a zero column for kernels without
    a key mask. With key constants: [1, q, 1], [sqrt(d) key_left, k, sqrt(d) key_right] and [0, v, 0]; the
    left calls take columns 0 .. d, the right ones and the windows 1 .. d + 1."""

    def __init__(self, q: Tensor, k: Tensor, with_key: bool, keep: Tensor | None, kernel_masks: bool,
                 masked_keys: dict | None = None):
        self.q, self.k, self.with_key, self.keep, self.masked_keys = q, k, with_key, keep, masked_keys
        self.d = q.shape[-1] - (2 if with_key else 1)
        # kernels that take no key mask see pads on the key column
        self.column_in_calls = with_key or (keep is not None and not kernel_masks)
        tail = slice(1, None) if with_key else slice(None)
        self.window_queries, self.window_keys = q[..., tail], k[..., tail]

    @classmethod
    def build(cls, q: Tensor, k: Tensor, key_left: Tensor | None, key_right: Tensor | None,
              keep: Tensor | None, kernel_masks: bool, key_constants: bool = False) -> _Operands:
        """key_constants: the key constants need no gradient (ALiBi's), so a kernel that takes a key mask gets them
        there, per head, and no call carries an extra column."""
        masked = None
        if key_constants and key_left is not None and kernel_masks:
            masked = _by_side(key_left.to(q.dtype), key_right.to(q.dtype))
            key_left = key_right = None  # no column for them
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
        return cls(q_buffer, k_buffer, with_key, keep, kernel_masks, masked)

    def side(self, x: Tensor, side: str) -> Tensor:
        """A (..., width) buffer as one side's fused call takes it."""
        if not self.with_key:
            return x if self.column_in_calls else x[..., :self.d]
        return x[..., :self.d + 1] if side == "left" else x[..., 1:]

    def main(self, x: Tensor, side: str) -> Tensor:
        """The d head columns of a fused call's output or gradient."""
        return x[..., 1:] if self.with_key and side == "left" else x[..., :self.d]

    def constant(self, x: Tensor, side: str) -> Tensor:
        """The key-constant column of a fused call's key gradient."""
        return x[..., 0] if side == "left" else x[..., self.d]

    def widen(self, x: Tensor) -> Tensor:
        """v, O or dO as the fused calls take them: [0, x, 0] with key constants, [x, 0] with pads on the
        column."""
        if self.with_key:
            return F.pad(x, (1, 1))
        return F.pad(x, (0, 1)) if self.column_in_calls else x

    def key_mask(self, call: FusedCall) -> Tensor | None:
        """Additive (batch, 1 or heads, 1, keys) mask of a fused call: its side's key constants where they ride
        here (`masked_keys`), and its pad keys at -max (finite, so an all-pad part gets a finite log-sum-exp and
        weight exp(lse_p - lse) = 0); None where the column carries both."""
        keys = call.keys
        if self.masked_keys is not None:
            mask = self.masked_keys[call.side][..., keys][:, :, None, :]
        elif self.keep is None or self.column_in_calls:
            return None
        else:
            mask = torch.zeros(self.keep[:, keys].shape, dtype=self.q.dtype, device=self.q.device)[:, None, None, :]
        if self.keep is not None:
            mask = mask.masked_fill(~self.keep[:, None, None, keys], torch.finfo(self.q.dtype).min)
        return mask


class _NearTerms:
    """Everything the near part's scores need, flattened to groups g = (batch, head, block): query rows
    (g, S, d + 1) with their column of ones, key rows (g, S + 2r, d + 1) with the key column (-max past the
    ends), value rows (g, S + 2r, d), the band (g, S, 2r + 1), and for "blocks" tiling the row constants
    (g, S) and key_left - key_right (g, S + 2r). `scores` builds a chunk of groups at a time."""

    def __init__(self, tiling: Tiling, operands: _Operands, v: Tensor, band: Tensor, rows: dict, keys: dict):
        self.tiling, self.d, self.acc = tiling, operands.d, _acc(band)
        self.queries = tiling.groups(operands.window_queries)
        key_windows = tiling.windows(operands.window_keys)
        tiling.hide_missing(key_windows, self.d)
        self.keys, self.values = key_windows.flatten(0, -3), tiling.windows(v).flatten(0, -3)
        if keys["right"] is not None:
            band = band - _band_keys(keys["right"], tiling.reach)  # the key column adds key_right to the band too
        self.band = tiling.groups(band.to(self.acc))
        self.rows = self.key_shift = self.key_right = None
        if operands.masked_keys is not None:  # no key column for them: key_right added to every entry instead
            self.key_right = tiling.windows(keys["right"][..., None].to(self.acc)).flatten(0, -3).mT
        if tiling.band_only:
            self.off_band = tiling.off_band(band.device)
        else:
            self.left = tiling.left_of_band(band.device)
            self.left_weight = self.left.to(self.acc)
            if rows["left"] is not None:
                self.rows = [tiling.groups(rows[side][..., None].to(self.acc)) for side in SIDES]
            if keys["left"] is not None:
                shift = (keys["left"] - keys["right"])[..., None].to(self.acc)
                self.key_shift = tiling.windows(shift).flatten(0, -3).mT
        self.count, size = self.queries.shape[0], tiling.size * (tiling.size + 2 * tiling.reach)
        chunk_bytes = CUDA_WINDOW_CHUNK_BYTES if band.is_cuda else WINDOW_CHUNK_BYTES
        self.chunk = max(1, chunk_bytes // (size * torch.finfo(self.acc).bits // 8))

    def chunks(self) -> list[slice]:
        return [slice(start, min(start + self.chunk, self.count)) for start in range(0, self.count, self.chunk)]

    def scores(self, chunk: slice) -> Tensor:
        """(groups, S, S + 2r) scores in the accumulation dtype: row constants beside the band, the band's
        bias on it, q . k / sqrt(d) and the key column by one matmul (which also hides missing and pad keys),
        and key_left - key_right left of the band; -max off the band with "causal" tiling."""
        q, k = self.queries[chunk], self.keys[chunk]
        shape = (q.shape[0], q.shape[1], k.shape[1])
        if self.rows is not None:
            scores = torch.where(self.left, self.rows[0][chunk], self.rows[1][chunk])
        else:
            scores = torch.zeros(shape, dtype=self.acc, device=q.device)
        self.tiling.band(scores).copy_(self.band[chunk])
        if self.acc == q.dtype:  # the score product accumulates into the bias, no extra pass
            scores.baddbmm_(q, k.mT, alpha=self.d ** -0.5)
        else:
            scores += torch.matmul(q, k.mT).to(self.acc) * self.d ** -0.5
        if self.key_right is not None:
            scores += self.key_right[chunk]
        if self.key_shift is not None:
            scores.addcmul_(self.left_weight, self.key_shift[chunk])
        if self.tiling.band_only:
            scores.masked_fill_(self.off_band, torch.finfo(self.acc).min)
        return scores


def _flip_rows(x):
    """Reverse the sequence axis of a (batch, heads, m, c) or (batch, heads, m) tensor; anything else as it is."""
    if not isinstance(x, Tensor):
        return x
    return x.flip(-2) if x.dim() == 4 else x.flip(-1)


def _call(kernel_function, call: FusedCall, operands: _Operands, tensors: list[Tensor], *args, **kwargs):
    """kernel_function(*tensors, *args, key_mask=..., causal=..., **kwargs) for a fused call whose tensors are
    taken already. An anti-causal call (right side) runs the kernel's causal mode on the sequences reversed;
    the outputs come back in the original order."""
    mask = operands.key_mask(call)
    flip = call.causal and call.side == "right"
    if flip:
        tensors = [_flip_rows(t) for t in tensors]
        mask = mask.flip(-1) if mask is not None else None
    outputs = kernel_function(*tensors, *args, key_mask=mask, causal=call.causal, **kwargs)
    return [_flip_rows(o) for o in outputs] if flip else outputs


def _prepare(q: Tensor, k: Tensor, v: Tensor, band: Tensor, rows: dict, keys: dict, keep: Tensor | None, reach: int,
             kernel, tiling: str, key_constants: bool = False) -> tuple[Tiling, _Operands, _NearTerms]:
    tiles = Tiling(q.shape[-2], reach, tiling)
    operands = _Operands.build(q, k, keys["left"], keys["right"], keep, kernel.takes_key_mask, key_constants)
    return tiles, operands, _NearTerms(tiles, operands, v, band, rows, keys)


@dataclass
class _Saved:
    """What backward needs of a forward besides its inputs and output: the operands and near terms (O(n d)),
    the merged log-sum-exp, exp(max_row - lse) of the near part, the left parts' merged output and log-sum-exp
    (row constants only), the near part's kept probabilities and dropout masks a chunk at a time, and each
    fused call's random state (a tuple of tensors, empty for kernels without dropout)."""

    tiles: Tiling
    operands: _Operands
    terms: _NearTerms | None
    lse: Tensor
    near_scale: Tensor
    left_out: Tensor | None
    left_lse: Tensor | None
    kept: list[Tensor] | None
    masks: list[Tensor] | None
    states: list[tuple[Tensor, ...]]

    def tensors(self) -> list[Tensor]:
        """The tensors alone, flat, none a view of another (a custom operator's outputs): lse, near_scale,
        left_out and left_lse (empty without row constants), the kept chunks, the masks, the states."""
        absent = self.left_out is None
        return [self.lse, self.near_scale, self.lse.new_empty(0) if absent else self.left_out,
                self.lse.new_empty(0) if absent else self.left_lse, *self.kept, *self.masks,
                *(t.clone() for state in self.states for t in state)]  # a state's tensors may view one tensor

    @classmethod
    def from_tensors(cls, tensors: list[Tensor], tiles: Tiling, operands: _Operands, terms: _NearTerms,
                     has_rows: bool, dropout_p: float, state_size: int) -> _Saved:
        """Inverse of `tensors`, given what the forward was built from."""
        lse, near_scale, left_out, left_lse, *rest = tensors
        chunks, calls = len(terms.chunks()), len(list(tiles.fused_calls()))
        kept, rest = rest[:chunks], rest[chunks:]
        masks, rest = (rest[:chunks], rest[chunks:]) if dropout_p else ([], rest)
        states = [tuple(rest[c * state_size:(c + 1) * state_size]) for c in range(calls)]
        return cls(tiles, operands, terms, lse, near_scale, left_out if has_rows else None,
                   left_lse if has_rows else None, kept, masks, states)


def _forward(q: Tensor, k: Tensor, v: Tensor, band: Tensor, rows: dict, keys: dict, keep: Tensor | None, reach: int,
             dropout_p: float, kernel, tiling: str, key_constants: bool = False) -> tuple[Tensor, _Saved]:
    d = q.shape[-1]
    acc, scale = _acc(q), d ** -0.5
    tiles, operands, terms = _prepare(q, k, v, band, rows, keys, keep, reach, kernel, tiling, key_constants)
    row_left = rows["left"]
    # the near part, a chunk of groups at a time: U = exp(s - max_row), kept for backward, and U V
    near_out = q.new_empty(*terms.queries.shape[:-1], d)
    top = torch.empty(terms.queries.shape[:-1], dtype=acc, device=q.device)
    near_lse = torch.empty_like(top)
    kept, masks = [], []
    for chunk in terms.chunks():
        scores = terms.scores(chunk)
        top[chunk] = scores.amax(-1)
        unnormalised = scores.sub_(top[chunk, :, None]).exp_()
        near_lse[chunk] = top[chunk] + unnormalised.sum(-1).log()
        compact = tiles.compact(unnormalised)
        kept.append(compact)
        if dropout_p:
            masks.append(torch.rand(compact.shape, device=q.device) >= dropout_p)
            unnormalised = tiles.expand(compact * masks[-1] / (1 - dropout_p))
        torch.matmul(unnormalised.to(v.dtype), terms.values[chunk], out=near_out[chunk])
    del scores, unnormalised
    heads_shape = q.shape[:-2]
    lse = tiles.ungroup(near_lse, heads_shape)
    values = operands.widen(v)
    side_lse = {side: torch.full(lse.shape, float("-inf"), dtype=acc, device=q.device) for side in SIDES}
    parts, states = [], []
    for call in tiles.fused_calls():
        tensors = [operands.side(operands.q, call.side)[..., call.queries, :],
                   operands.side(operands.k, call.side)[..., call.keys, :],
                   operands.side(values, call.side)[..., call.keys, :]]
        out_p, lse_p, state = _call(kernel.forward, call, operands, tensors, dropout_p=dropout_p, scale=scale)
        if rows[call.side] is not None:
            lse_p = lse_p + rows[call.side][..., call.queries].to(acc)
        part_lse = side_lse[call.side][..., call.queries]
        torch.logaddexp(part_lse, lse_p, out=part_lse)
        parts.append((call, operands.main(out_p, call.side), lse_p))
        states.append(state)
    for side in SIDES:
        lse = torch.logaddexp(lse, side_lse[side])
    near_scale = torch.exp(top - tiles.groups(lse[..., None])[..., 0])  # exp(max_row - lse): U -> P
    out = tiles.ungroup(near_out, heads_shape).to(acc)
    out *= tiles.ungroup(near_scale, heads_shape)[..., None]
    # the row terms' gradients need the left parts' own outputs and log-sum-exp (see backward)
    left_out = q.new_zeros(q.shape) if row_left is not None else None  # kept in q's dtype, like out
    for call, out_p, lse_p in parts:
        out[..., call.queries, :].addcmul_(torch.exp(lse_p - lse[..., call.queries])[..., None], out_p.to(acc))
        if left_out is not None and call.side == "left":
            weight = torch.exp(lse_p - side_lse["left"][..., call.queries])[..., None]
            left_out[..., call.queries, :].addcmul_(weight.to(q.dtype), out_p)
    out = out.to(q.dtype)
    left_lse = side_lse["left"] if row_left is not None else None
    return out, _Saved(tiles, operands, terms, lse, near_scale, left_out, left_lse, kept, masks, states)


def _backward(grad_out: Tensor, v: Tensor, rows: dict, out: Tensor, saved: _Saved, kernel, dropout_p: float):
    """Gradients of q, k, v, band, row_left, row_right, key_left, key_right (None for absent terms)."""
    operands, terms, tiles = saved.operands, saved.terms, saved.tiles
    lse, left_out, left_lse, row_left = saved.lse, saved.left_out, saved.left_lse, rows["left"]
    n, d, reach = out.shape[-2], out.shape[-1], tiles.reach
    acc, scale = _acc(out), d ** -0.5
    has_rows, has_keys = row_left is not None, operands.with_key
    near_sides = has_rows and not tiles.band_only  # row / key constants inside the near part
    grad_out = grad_out.contiguous()
    row_term = (grad_out.to(acc) * out.to(acc)).sum(-1)  # D_i = dO_i . O_i
    # the near part: dS = P (dP - D) and dV = P^T dO with P = U f, f = exp(max_row - lse) moved onto dO and D,
    # and dropout's mask / (1 - p) on dP and on P for dV
    scaled_grad = tiles.groups(grad_out) * saved.near_scale[..., None].to(grad_out.dtype)
    scaled_row_term = tiles.groups(row_term[..., None]) * saved.near_scale[..., None]
    grad_band = torch.empty(terms.band.shape, dtype=acc, device=out.device)
    grad_q = out.new_empty(*terms.queries.shape[:-1], d)
    grad_keys_window = out.new_empty(terms.keys.shape)
    grad_v = out.new_empty(terms.values.shape)
    left_rows = torch.zeros(terms.queries.shape[:-1], dtype=acc, device=out.device) if has_rows else None
    left_keys = torch.zeros(terms.keys.shape[:-1], dtype=acc, device=out.device) if has_keys else None
    masks = saved.masks or [None] * len(saved.kept)
    for chunk, kept, mask in zip(terms.chunks(), saved.kept, masks, strict=True):
        unnormalised = tiles.expand(kept)
        grad_scores = torch.matmul(scaled_grad[chunk], terms.values[chunk].mT).to(acc)
        if mask is not None:
            dropped = tiles.expand(kept * mask / (1 - dropout_p))
            grad_scores.mul_(tiles.expand(mask.to(acc) / (1 - dropout_p)))
        else:
            dropped = unnormalised
        grad_scores.sub_(scaled_row_term[chunk]).mul_(unnormalised)
        grad_band[chunk] = tiles.band(grad_scores)
        ds = grad_scores.to(out.dtype)
        torch.matmul(ds, terms.keys[chunk][..., :d], out=grad_q[chunk])
        # the queries' column of ones makes the key gradient's last column each key's sum of dS
        torch.matmul(ds.mT, terms.queries[chunk], out=grad_keys_window[chunk])
        torch.matmul(dropped.to(out.dtype).mT, scaled_grad[chunk], out=grad_v[chunk])
        if near_sides or (has_keys and not tiles.band_only):  # sums of dS left of the band
            grad_scores.mul_(terms.left_weight)
            if near_sides:
                left_rows[chunk] = grad_scores.sum(-1)
            if has_keys:
                left_keys[chunk] = grad_scores.sum(-2)
    del unnormalised, dropped, grad_scores, ds
    heads_shape = out.shape[:-2]
    window_shape = (*heads_shape, tiles.count)  # (batch, heads, blocks): key windows fold, not ungroup
    grad_band = tiles.ungroup(grad_band, heads_shape)
    grad_q = tiles.ungroup(grad_q, heads_shape).to(acc).mul_(scale)
    grad_keys_window = tiles.fold(grad_keys_window.view(*window_shape, *terms.keys.shape[1:])).to(acc)
    grad_k = grad_keys_window[..., :d].mul_(scale)
    grad_v = tiles.fold(grad_v.view(*window_shape, *terms.values.shape[1:])).to(acc)
    saved.kept = saved.masks = saved.terms = terms = None  # the near part is done with: free it before the fused calls
    if has_rows:
        left_rows = tiles.ungroup(left_rows, heads_shape)
    if has_keys:
        left_keys = tiles.fold(left_keys.view(*window_shape, -1, 1))[..., 0]
    grad_key = {side: torch.zeros(lse.shape, dtype=acc, device=lse.device) for side in SIDES} if has_keys else {}
    grad_part, out_part, values = operands.widen(grad_out), operands.widen(out), operands.widen(v)
    # the kernel's P_ij = exp(s_ij - lse_i) with the merged lse minus the row constant it never saw
    kernel_lse = {side: (lse if rows[side] is None else lse - rows[side].to(acc)).contiguous() for side in SIDES}
    for call, state in zip(tiles.fused_calls(), saved.states, strict=True):
        side, queries, keys = call.side, call.queries, call.keys
        tensors = [operands.side(grad_part, side)[..., queries, :],
                   operands.side(operands.q, side)[..., queries, :], operands.side(operands.k, side)[..., keys, :],
                   operands.side(values, side)[..., keys, :], operands.side(out_part, side)[..., queries, :],
                   kernel_lse[side][..., queries]]
        gq, gk, gv = _call(kernel.backward, call, operands, tensors, state, dropout_p=dropout_p, scale=scale)
        grad_q[..., queries, :] += operands.main(gq, side)
        grad_k[..., keys, :] += operands.main(gk, side)
        grad_v[..., keys, :] += operands.main(gv, side)
        if has_keys:
            grad_key[side][..., keys] += operands.constant(gk, side) * d ** 0.5
    grad_rows = {}
    if has_rows:
        # the left fused parts add w_p (dO_i . O^p_i - D_i); the right side's sum is minus the band's
        # and the left's, since sum_j dS_ij = 0
        left_fused = torch.exp(left_lse - lse) * ((grad_out.to(acc) * left_out.to(acc)).sum(-1) - row_term)
        grad_rows["left"] = left_rows + left_fused
        has_right = torch.arange(n, device=lse.device) < n - reach - 1
        grad_rows["right"] = -(grad_band.sum(-1) + grad_rows["left"]) * has_right
    if has_keys:
        # in the near part key_right came with every entry, taken back on the band and left of it
        grad_key["left"] += left_keys
        grad_key["right"] += grad_keys_window[..., d] - _band_key_sums(grad_band, reach) - left_keys
    dtype = out.dtype
    return (grad_q.to(dtype), grad_k.to(dtype), grad_v.to(dtype), grad_band.to(dtype),
            *(grad_rows[side].to(dtype) if side in grad_rows else None for side in SIDES),
            *(grad_key[side].to(dtype) if side in grad_key else None for side in SIDES))


class DecomposedRelativeAttention(torch.autograd.Function):
    """softmax(q k^T / sqrt(d) + relative bias + padding mask) with dropout, times v (see the module docstring).

    q, k, v: (batch, heads, n, d); band: (batch, heads, n, 2r + 1), the bias of key i + t - r at [i, t];
    row_*: (batch, heads, n) or None, the off-band bias per query row; key_*: (batch, heads, n) or
    None, per key; keep: (batch, n) bool or None; kernel: from kernels.py; tiling: "blocks" or "causal";
    key_constants: the key constants take no gradient (ALiBi's), so a kernel with a key mask carries them there.
    """

    @staticmethod
    def forward(ctx, q, k, v, band, row_left, row_right, key_left, key_right, keep, reach, dropout_p, kernel, tiling,
                key_constants=False):
        rows, keys = _by_side(row_left, row_right), _by_side(key_left, key_right)
        out, saved = _forward(q, k, v, band, rows, keys, keep, reach, dropout_p, kernel, tiling, key_constants)
        ctx.save_for_backward(v, row_left, row_right, out)
        ctx.saved, ctx.kernel, ctx.dropout_p = saved, kernel, dropout_p
        return out

    @staticmethod
    def backward(ctx, grad_out):
        v, row_left, row_right, out = ctx.saved_tensors
        saved, ctx.saved = ctx.saved, None  # backward frees the near part as soon as it is done with it
        grads = _backward(grad_out, v, _by_side(row_left, row_right), out, saved, ctx.kernel, ctx.dropout_p)
        return *grads, None, None, None, None, None, None


# Under torch.compile the same computation runs as an opaque custom operator (the graph holds one node per
# call, its fake version runs the same code on fake tensors): what the eager autograd function keeps on its
# context object becomes the operator's extra outputs, and backward rebuilds the O(n d) operands and near
# terms from the inputs. The kernel is the device's (kernels.fused_kernel).


def _attend_for_compile(q: Tensor, k: Tensor, v: Tensor, band: Tensor, row_left: Tensor | None,
                        row_right: Tensor | None, key_left: Tensor | None, key_right: Tensor | None,
                        keep: Tensor | None, reach: int, dropout_p: float, tiling: str,
                        key_constants: bool) -> list[Tensor]:
    rows, keys = _by_side(row_left, row_right), _by_side(key_left, key_right)
    out, saved = _forward(q, k, v, band, rows, keys, keep, reach, dropout_p, fused_kernel(q.device, q.dtype), tiling,
                          key_constants)
    return [out, *saved.tensors()]


def _attend_backward_for_compile(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, band: Tensor,
                                 row_left: Tensor | None, row_right: Tensor | None, key_left: Tensor | None,
                                 key_right: Tensor | None, keep: Tensor | None, out: Tensor, saved: list[Tensor],
                                 reach: int, dropout_p: float, tiling: str, key_constants: bool) -> list[Tensor]:
    rows, keys = _by_side(row_left, row_right), _by_side(key_left, key_right)
    kernel = fused_kernel(q.device, q.dtype)
    tiles, operands, terms = _prepare(q, k, v, band, rows, keys, keep, reach, kernel, tiling, key_constants)
    state = _Saved.from_tensors(saved, tiles, operands, terms, row_left is not None, dropout_p, kernel.state_size)
    grads = _backward(grad_out, v, rows, out, state, kernel, dropout_p)
    return [q.new_empty(0) if grad is None else grad for grad in grads]


_relative_attention_op = torch.library.custom_op("convattn::relative_attention", _attend_for_compile,
                                                 mutates_args=())
_relative_attention_op.register_fake(_attend_for_compile)
_relative_attention_backward_op = torch.library.custom_op("convattn::relative_attention_backward",
                                                          _attend_backward_for_compile, mutates_args=())
_relative_attention_backward_op.register_fake(_attend_backward_for_compile)


def _op_setup_context(ctx, inputs, output):
    *tensors, reach, dropout_p, tiling, key_constants = inputs
    ctx.save_for_backward(*tensors, *output)
    ctx.reach, ctx.dropout_p, ctx.tiling, ctx.key_constants = reach, dropout_p, tiling, key_constants
    ctx.set_materialize_grads(False)  # the extra outputs get no gradient


def _op_backward(ctx, grads):
    q, k, v, band, row_left, row_right, key_left, key_right, keep, out, *saved = ctx.saved_tensors
    inputs = (q, k, v, band, row_left, row_right, key_left, key_right)
    if grads[0] is None:
        return (None,) * 13
    result = _relative_attention_backward_op(grads[0], *inputs, keep, out, saved, ctx.reach, ctx.dropout_p,
                                             ctx.tiling, ctx.key_constants)
    # (key constants that take no gradient get none: result's entries for them are empty)
    tensor_grads = (None if x is None or grad.numel() == 0 else grad for x, grad in zip(inputs, result, strict=True))
    return *tensor_grads, None, None, None, None, None


_relative_attention_op.register_autograd(_op_backward, setup_context=_op_setup_context)


def decomposed_relative_attention(q: Tensor, k: Tensor, v: Tensor, pieces: dict, keep: Tensor | None, reach: int,
                                  dropout_p: float, kernel, tiling: str | None = None) -> Tensor:
    """The exact attention of the module docstring; `pieces` from RelativePositionBias.pieces, `kernel` from
    kernels.py, tiling its own unless given. Under torch.compile, with the device's kernel, one custom operator."""
    tensors = (q, k, v, pieces["band"].contiguous(), pieces["row_left"], pieces["row_right"], pieces["key_left"],
               pieces["key_right"], keep, reach, dropout_p)
    key_constants = pieces["key_constants"]
    if torch.compiler.is_compiling() and kernel is fused_kernel(q.device, q.dtype):
        return _relative_attention_op(*tensors, tiling or kernel.tiling, key_constants)[0]
    return DecomposedRelativeAttention.apply(*tensors, kernel, tiling or kernel.tiling, key_constants)
