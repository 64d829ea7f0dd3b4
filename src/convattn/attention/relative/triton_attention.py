"""Attention with relative terms in one fused Triton kernel, forward and backward (attn_implementation
"convattn_triton"; the CUDA default).

The score of query i and key j (Chang et al. 2021, Eqs. 4-6; bias.py) is

    s_ij = q_i . k_j * scale + A[i, c(j - i)] + B[j, c(i - j)],    c(t) = clamp(t, -r, r) + r,

with A = fixed + q W / sqrt(d) (the row table) and B = k U / sqrt(d) (the key table), both (.., n, 2r + 1) and
built outside the kernel. In "zero" mode the terms vanish where |j - i| > r. The kernel is FlashAttention-2
(Dao 2023) with the tables read inside it: a tile of (query, key) pairs wholly left of the band (j < i - r)
adds only A[i, 0] + B[j, 2r], one wholly right (j > i + r) only A[i, 2r] + B[j, 0], and a tile that touches
the band gathers its columns. The loops over key tiles run in those three ranges, so the gather is paid on
about (BLOCK_M + 2r) / BLOCK_N tiles per query block.

Dropout draws its mask from Philox (`tl.randint4x`, seven rounds: sixteen bytes a call, a byte per score, the
sixteen scores of a call chosen so that the numbers land where the scores are; dropout_keep) keyed by (seed +
batch * heads + head, a counter of the query pair and the key's chunk of 32); the backward draws the same numbers.
p is rounded to a multiple of 1/256 (kernel_dropout_p), query tiles are multiples of 16 queries, key tiles of 32
keys.
Backward has no atomics (FlashAttention-2's split): one kernel per key block sums dK, dV and the key table's
gradient over the query blocks, another per query block sums dQ and the row table's gradient over the key blocks,
with dS_ij = P_ij (dP_ij - D_i), D_i = dO_i . O_i (Dao et al. 2022, Appendix B.2). A table's gradient at [i, t]
is the sum of dS_ij over the keys j whose pair falls in column t: one partner inside the band (stored), every one
beyond it in the edge columns (summed in registers), each entry written once.

Operands are either padded, (batch, heads, n, d) with an optional key mask `keep` (batch, n), or packed
variable-length sequences, (total, heads, d) with `cu_seqlens` (batch + 1,) as in flash-attn's varlen API. Keys
past a sequence's last real one are skipped, and the mask is read tile by tile only where pads come before it
(key_extent), so right padding costs nothing per tile.
On CPU the kernels run only under Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported):
that is how the tests check them.
"""

from __future__ import annotations

import os
from functools import cache

import torch
import triton
import triton.language as tl
from torch import Tensor

from convattn.attention.core import is_tracing


def interpreting() -> bool:
    """Whether triton runs kernels on the CPU (TRITON_INTERPRET=1, read when this module is imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def band_bias(A, B, i, j, n, sa_s, sb_s, REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr,
              HAS_KEY: tl.constexpr):
    """A[i, c(j - i)] + B[j, c(i - j)] for broadcastable rows i and keys j (at least one table), in float32. Rows
    and keys past n read row n - 1 instead of a mask per score: their scores are masked or discarded (the key
    kernel gives rows past n no probability)."""
    offset = j - i
    column = tl.minimum(tl.maximum(offset, -REACH), REACH) + REACH
    if HAS_ROW:
        bias = tl.load(A + tl.minimum(i, n - 1) * sa_s + column).to(tl.float32)
        if HAS_KEY:
            bias += tl.load(B + tl.minimum(j, n - 1) * sb_s + (2 * REACH - column)).to(tl.float32)
    else:
        bias = tl.load(B + tl.minimum(j, n - 1) * sb_s + (2 * REACH - column)).to(tl.float32)
    if not CLIP:
        bias = tl.where((offset >= -REACH) & (offset <= REACH), bias, 0.0)
    return bias


LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def edge(T, rows, n, s_s, COLUMN: tl.constexpr, HAS: tl.constexpr):
    """T[rows, COLUMN] in float32 and log2 units (times log2 e), 0 where absent."""
    if HAS:
        return tl.load(T + rows * s_s + COLUMN, mask=rows < n, other=0.0).to(tl.float32) * LOG2E
    return (rows * 0).to(tl.float32)


@triton.jit
def word_bytes(word):
    """The four bytes of 32-bit words, (.., b, c) for byte 2 c + b."""
    return tl.join(tl.join(word & 0xFF, (word >> 8) & 0xFF), tl.join((word >> 16) & 0xFF, word >> 24))


@triton.jit
def dropout_keep(seed, query_start, key_start, counters_per_row, p_drop, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """Which probabilities of queries query_start .. + BLOCK_M - 1 and keys key_start .. + BLOCK_N - 1 dropout keeps
    (query_start a multiple of 16, key_start of 32). A Philox call (Salmon et al. 2011) gives sixteen bytes, one
    number per score: queries 16 g + u and 16 g + 8 + u (u < 8) share the calls of counters
    (16 g + u) * counters_per_row + 4 h + t, whose words 0, 1 serve the first and 2, 3 the second, and key
    32 h + 8 c + 2 t + b reads byte 2 (c % 2) + b of word c // 2 of its row's pair. These sixteen scores are those one
    thread holds in the tensor cores' accumulator layout (rows u and u + 8, columns 8 c + 2 t + b for its u and t),
    so the numbers need no trip through shared memory to meet the scores, and they are the same however the kernels
    tile. A score is kept where its byte is at least p_drop * 256 (p_drop a multiple of 1/256: kernel_dropout_p).
    Bytes and seven rounds are what the flash kernel behind SDPA draws its dropout with, a third of ten rounds'
    and sixteen-bit numbers' cost per score."""
    pair = query_start + 16 * tl.arange(0, BLOCK_M // 16)[:, None] + tl.arange(0, 8)[None, :]  # (g, u)
    chunk = key_start // 32 + tl.arange(0, BLOCK_N // 32)
    counter = (pair[:, :, None, None] * counters_per_row + chunk[None, None, :, None] * 4
               + tl.arange(0, 4)[None, None, None, :])
    r0, r1, r2, r3 = tl.randint4x(seed, counter, 7)  # each (g, u, h, t)
    first = tl.join(word_bytes(r0), word_bytes(r1))  # (g, u, h, t, b, c % 2, c // 2)
    second = tl.join(word_bytes(r2), word_bytes(r3))
    numbers = tl.permute(tl.join(first, second), (0, 7, 1, 2, 6, 5, 3, 4))  # (g, row half, u, h, c // 2, c % 2, t, b)
    return tl.reshape(numbers, (BLOCK_M, BLOCK_N)) >= tl.cast(p_drop * 256.0, tl.uint32)


@triton.jit
def key_extent(KEEP, n, HAS_KEEP: tl.constexpr):
    """(end, holes) of a sequence's keys: one past its last real key (0 where it has none), and whether a pad lies
    before it. The kernels skip the keys from end on and mask pads before it only where there are holes, so right
    padding costs nothing per tile. A sequence without a real key attends to nothing: its output and every gradient
    it sends are zero, as SDPA gives a fully masked row."""
    if HAS_KEEP:
        last = n * 0
        count = n * 0
        for start in range(0, n, 1024):
            j = start + tl.arange(0, 1024)
            real = tl.load(KEEP + j, mask=j < n, other=0) != 0
            last = tl.maximum(last, tl.max(tl.where(real, j + 1, 0), 0))
            count += tl.sum(real.to(tl.int32), 0)
        return last, count < last
    return n, False


@triton.jit
def real_keys(KEEP, j, key_end, holes, HAS_KEEP: tl.constexpr):
    """Which keys j are real: before key_end, and by the key mask where the sequence has holes (the mask is read
    only then: a fully masked load reads nothing)."""
    real = j < key_end
    if HAS_KEEP:
        real = real & (tl.load(KEEP + j, mask=real & holes, other=1) != 0)
    return real


@triton.jit
def mask_pads(s, KEEP, j, key_start, key_end, holes, HAS_KEEP: tl.constexpr):
    """Scores of keys j (key_start ..) with pads at -1e30, which loses to every real score without the NaN of
    (-inf) - (-inf) on a wholly masked tile; only a tile reaching past key_end, or one of a sequence with holes,
    has any."""
    masked = key_start + j.shape[0] > key_end
    if HAS_KEEP:
        masked = masked | holes
    if masked:
        s = tl.where(real_keys(KEEP, j, key_end, holes, HAS_KEEP)[None, :], s, -1.0e30)
    return s


@triton.jit
def score_tile(q, k, A, B, i, j, row_edge, key_edge, n, sa_s, sb_s, scale, MODE: tl.constexpr,
               REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr,
               PRECISION: tl.constexpr):
    """Scores in log2 units (times log2 e, for exp2) of queries i (BLOCK_M,) and keys j (BLOCK_N,): MODE 0 keys
    left of the band, 1 touching it, 2 right of it; the edges come in log2 units."""
    if MODE == 1 and (HAS_ROW or HAS_KEY):
        # The gathered terms enter as the product's accumulator, in q . k units. Added to the product's result
        # instead, the gather's own layout spread from them into the softmax, which Triton then computed twice,
        # once per layout, with the tile converted between them through shared memory.
        bias = band_bias(A, B, i[:, None], j[None, :], n, sa_s, sb_s, REACH, CLIP, HAS_ROW, HAS_KEY) * (1.0 / scale)
        return tl.dot(q, tl.trans(k), acc=bias, input_precision=PRECISION) * (scale * LOG2E)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * (scale * LOG2E)
    if MODE != 1 and CLIP and (HAS_ROW or HAS_KEY):
        s += row_edge[:, None] + key_edge[None, :]
    return s


@triton.jit
def forward_tiles(acc, m_i, l_i, q, i, i0, row_edge, K, V, A, B, KEEP, first, last, n, key_end, holes, seed,
                  rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, scale, MODE: tl.constexpr, REACH: tl.constexpr,
                  CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr, HAS_KEEP: tl.constexpr,
                  DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  PRECISION: tl.constexpr):
    d = tl.arange(0, BLOCK_D)
    for start in range(first, last, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        operand_mask = (j < n)[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(K + j[:, None] * sk_s + d[None, :], mask=operand_mask, other=0.0)
        key_edge = edge(B, j, n, sb_s, 0 if MODE == 2 else 2 * REACH, HAS_KEY and CLIP and MODE != 1)
        s = score_tile(q, k, A, B, i, j, row_edge, key_edge, n, sa_s, sb_s, scale, MODE, REACH, CLIP,
                       HAS_ROW, HAS_KEY, PRECISION)
        s = mask_pads(s, KEEP, j, start, key_end, holes, HAS_KEEP)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            p = tl.where(dropout_keep(seed, i0, start, rng_stride, p_drop, i.shape[0], BLOCK_N), p, 0.0)
        v = tl.load(V + j[:, None] * sv_s + d[None, :], mask=operand_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def band_tiles(start, n, SIZE: tl.constexpr, OTHER: tl.constexpr, REACH: tl.constexpr):
    """[first, last): the tiles of OTHER positions that hold a position within REACH of start .. start + SIZE - 1
    (tiles before lie wholly on one side of the band, tiles after on the other). Plain ifs, not tl.maximum:
    integer division truncates on a GPU and floors in the interpreter, so no negative operand reaches it."""
    first = start * 0
    if start > REACH:
        first = (start - REACH) // OTHER * OTHER
    last = (start + SIZE - 1 + REACH) // OTHER * OTHER + OTHER
    if last > n:
        last = n
    return first, last


@triton.jit
def start_of(batch, head, first, s_b, s_h, s_s):
    """Where (batch, head)'s sequence starts in an operand with those strides (first: its packed offset)."""
    return batch * s_b + head * s_h + first * s_s


@triton.jit
def sequence(CU, batch, seqlen, VARLEN: tl.constexpr):
    if VARLEN:
        first = tl.load(CU + batch)
        return first, tl.load(CU + batch + 1) - first
    return 0, seqlen


@triton.jit(do_not_specialize=["seed", "seqlen", "rng_stride", "length_bucket"])
def forward_kernel(Q, K, V, A, B, KEEP, CU, OUT, LSE, seed, p_drop, scale, seqlen, rng_stride, heads,
                   sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h, so_s,
                   sa_b, sa_h, sa_s, sb_b, sb_h, sb_s, skeep_b, sl_b, sl_h, length_bucket,
                   REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr,
                   HAS_KEEP: tl.constexpr, VARLEN: tl.constexpr, DROPOUT: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    block, bh = tl.program_id(0), tl.program_id(1)
    batch, head = bh // heads, bh % heads
    first, n = sequence(CU, batch, seqlen, VARLEN)
    i0 = block * BLOCK_M
    if i0 >= n:
        return
    Q += start_of(batch, head, first, sq_b, sq_h, sq_s)
    K += start_of(batch, head, first, sk_b, sk_h, sk_s)
    V += start_of(batch, head, first, sv_b, sv_h, sv_s)
    OUT += start_of(batch, head, first, so_b, so_h, so_s)
    A += start_of(batch, head, first, sa_b, sa_h, sa_s)
    B += start_of(batch, head, first, sb_b, sb_h, sb_s)
    KEEP += batch * skeep_b
    LSE += batch * sl_b + head * sl_h + first
    i = i0 + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    row_mask = (i < n)[:, None] & (d < HEAD_DIM)[None, :]
    key_end, holes = key_extent(KEEP, n, HAS_KEEP)
    if key_end == 0:
        tl.store(OUT + i[:, None] * so_s + d[None, :], tl.zeros((BLOCK_M, BLOCK_D), OUT.dtype.element_ty),
                 mask=row_mask)
        tl.store(LSE + i, tl.zeros((BLOCK_M,), tl.float32), mask=i < n)
        return
    q = tl.load(Q + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    seed = seed + bh
    # key tiles wholly left of the band, touching it, wholly right of it, up to the last real key
    band_first, band_last = band_tiles(i0, n, BLOCK_M, BLOCK_N, REACH)
    left = edge(A, i, n, sa_s, 0, HAS_ROW and CLIP)
    acc, m_i, l_i = forward_tiles(acc, m_i, l_i, q, i, i0, left, K, V, A, B, KEEP, 0, tl.minimum(band_first, key_end),
                                  n, key_end, holes, seed,
                                  rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, scale, 0, REACH, CLIP, HAS_ROW,
                                  HAS_KEY, HAS_KEEP, DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION)
    acc, m_i, l_i = forward_tiles(acc, m_i, l_i, q, i, i0, left, K, V, A, B, KEEP, band_first,
                                  tl.minimum(band_last, key_end), n, key_end, holes, seed,
                                  rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, scale, 1, REACH, CLIP, HAS_ROW,
                                  HAS_KEY, HAS_KEEP, DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION)
    right = edge(A, i, n, sa_s, 2 * REACH, HAS_ROW and CLIP)
    acc, m_i, l_i = forward_tiles(acc, m_i, l_i, q, i, i0, right, K, V, A, B, KEEP, band_last, key_end, n, key_end,
                                  holes, seed,
                                  rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, scale, 2, REACH, CLIP, HAS_ROW,
                                  HAS_KEY, HAS_KEEP, DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION)
    out = acc / l_i[:, None]
    if DROPOUT:
        out = out / (1.0 - p_drop)
    tl.store(OUT + i[:, None] * so_s + d[None, :], out.to(OUT.dtype.element_ty), mask=row_mask)
    tl.store(LSE + i, m_i + tl.log2(l_i), mask=i < n)


@triton.jit
def gradient_tile(q, k, v, do, lse, delta, A, B, KEEP, i, j, query_start, key_start, row_edge, key_edge, n, key_end,
                  holes, seed, rng_stride, p_drop, sa_s, sb_s, scale, MODE: tl.constexpr, REACH: tl.constexpr,
                  CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr, HAS_KEEP: tl.constexpr,
                  DROPOUT: tl.constexpr, PRECISION: tl.constexpr, MASK_PADS: tl.constexpr):
    """(P with dropout applied, dS) of a (BLOCK_M, BLOCK_N) tile; without MASK_PADS, the columns of pad keys are
    left unmasked (any value, inf or NaN included) for the caller to discard."""
    s = score_tile(q, k, A, B, i, j, row_edge, key_edge, n, sa_s, sb_s, scale, MODE, REACH, CLIP, HAS_ROW,
                   HAS_KEY, PRECISION)
    if MASK_PADS:
        s = mask_pads(s, KEEP, j, key_start, key_end, holes, HAS_KEEP)
    p = tl.exp2(s - lse[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    if DROPOUT:
        keep = dropout_keep(seed, query_start, key_start, rng_stride, p_drop, i.shape[0], j.shape[0])
        rescale = 1.0 / (1.0 - p_drop)  # a scalar: one division, not one per score
        dp = tl.where(keep, dp * rescale, 0.0)
        p_dropped = tl.where(keep, p * rescale, 0.0)
    else:
        p_dropped = p
    return p_dropped, p * (dp - delta[:, None])


@triton.jit
def band_table_gradient(T, ds, owner, offset, stored_pairs, s_s, low, high, AXIS: tl.constexpr,
                        REACH: tl.constexpr, CLIP: tl.constexpr):
    """A band tile's share of a table's gradient: the table row of `owner` (a query for the row table, a key for the
    key table) gets dS at column offset + r, `offset` the other position minus the owner's, for the pairs where
    stored_pairs holds. Inside the band each (owner, column) has exactly one partner, so those entries are stored,
    never summed; in clip mode the edge columns 0 and 2r gather every partner beyond the band, summed into `low`
    and `high` over AXIS."""
    stored = REACH - 1 if CLIP else REACH  # the offsets whose column has one partner
    inside = (offset >= -stored) & (offset <= stored)
    tl.store(T + owner * s_s + offset + REACH, ds, mask=inside & stored_pairs)
    if CLIP:
        low += tl.sum(tl.where(offset <= -REACH, ds, 0.0), AXIS)
        high += tl.sum(tl.where(offset >= REACH, ds, 0.0), AXIS)
    return low, high


@triton.jit
def store_edges(T, owner, n, s_s, low, high, REACH: tl.constexpr):
    tl.store(T + owner * s_s, low, mask=owner < n)
    tl.store(T + owner * s_s + 2 * REACH, high, mask=owner < n)


@triton.jit
def zero_unpartnered(T, owner, n, partner_end, whole, s_s, REACH: tl.constexpr, CLIP: tl.constexpr):
    """Zeros in a table gradient's entries that no tile stores, so that it needs no zero-filled buffer: in the rows
    of `owner` (< n) where `whole` holds, all of them; in the others, the columns t whose partner owner + t - r lies
    outside 0 .. partner_end - 1 (clip mode's edge columns excepted: store_edges writes those). A tile may store a
    zero where this does too, never another value."""
    zero = (owner * 0).to(T.dtype.element_ty)
    for t in range(0, 2 * REACH + 1):
        partner = owner + (t - REACH)
        outside = (partner < 0) | (partner >= partner_end)
        if CLIP:
            outside = outside & (t > 0) & (t < 2 * REACH)
        tl.store(T + owner * s_s + t, zero, mask=(owner < n) & (whole | outside))


@triton.jit
def query_gradient_tiles(dq, da_low, da_high, q, do, lse, delta, i, i0, row_edge, K, V, A, B, KEEP, DA, first, last, n,
                         key_end, holes, seed, rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, sda_s, scale,
                         MODE: tl.constexpr, REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr,
                         HAS_KEY: tl.constexpr, HAS_KEEP: tl.constexpr, DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    d = tl.arange(0, BLOCK_D)
    for start in range(first, last, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        operand_mask = (j < n)[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(K + j[:, None] * sk_s + d[None, :], mask=operand_mask, other=0.0)
        v = tl.load(V + j[:, None] * sv_s + d[None, :], mask=operand_mask, other=0.0)
        key_edge = edge(B, j, n, sb_s, 0 if MODE == 2 else 2 * REACH, HAS_KEY and CLIP and MODE != 1)
        _, ds = gradient_tile(q, k, v, do, lse, delta, A, B, KEEP, i, j, i0, start, row_edge, key_edge, n, key_end,
                              holes, seed, rng_stride, p_drop, sa_s, sb_s, scale, MODE, REACH, CLIP, HAS_ROW, HAS_KEY,
                              HAS_KEEP, DROPOUT, PRECISION, True)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        if HAS_ROW:
            if MODE == 1:
                da_low, da_high = band_table_gradient(DA, ds, i[:, None], j[None, :] - i[:, None],
                                                      (i < n)[:, None] & (j < n)[None, :], sda_s, da_low, da_high,
                                                      1, REACH, CLIP)
            elif CLIP and MODE == 0:
                da_low += tl.sum(ds, 1)
            elif CLIP:
                da_high += tl.sum(ds, 1)
    return dq, da_low, da_high


@triton.jit(do_not_specialize=["seed", "seqlen", "rng_stride", "length_bucket"])
def query_gradient_kernel(Q, K, V, A, B, KEEP, CU, DO, OUT, LSE, DELTA, DQ, DA, seed, p_drop, scale, seqlen,
                          rng_stride, heads, sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
                          sa_b, sa_h, sa_s, sb_b, sb_h, sb_s, skeep_b, sl_b, sl_h, sda_b, sda_h, sda_s, length_bucket,
                          REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr,
                          HAS_KEY: tl.constexpr, HAS_KEEP: tl.constexpr, VARLEN: tl.constexpr,
                          DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          PRECISION: tl.constexpr):
    """dQ and the row table's gradient of one query block, and D_i = dO_i . O_i of its rows, which the key kernel
    (launched after this one) reads; DO, OUT and DQ are laid out as Q."""
    block, bh = tl.program_id(0), tl.program_id(1)
    batch, head = bh // heads, bh % heads
    first, n = sequence(CU, batch, seqlen, VARLEN)
    i0 = block * BLOCK_M
    if i0 >= n:
        return
    offset_q = start_of(batch, head, first, sq_b, sq_h, sq_s)
    Q += offset_q
    DO += offset_q
    OUT += offset_q
    DQ += offset_q
    K += start_of(batch, head, first, sk_b, sk_h, sk_s)
    V += start_of(batch, head, first, sv_b, sv_h, sv_s)
    A += start_of(batch, head, first, sa_b, sa_h, sa_s)
    B += start_of(batch, head, first, sb_b, sb_h, sb_s)
    DA += start_of(batch, head, first, sda_b, sda_h, sda_s)
    KEEP += batch * skeep_b
    LSE += batch * sl_b + head * sl_h + first
    DELTA += batch * sl_b + head * sl_h + first
    i = i0 + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    row_mask = (i < n)[:, None] & (d < HEAD_DIM)[None, :]
    key_end, holes = key_extent(KEEP, n, HAS_KEEP)
    if key_end == 0:  # D_i is read by the key kernel only for keys that this sequence lacks
        tl.store(DQ + i[:, None] * sq_s + d[None, :], tl.zeros((BLOCK_M, BLOCK_D), DQ.dtype.element_ty),
                 mask=row_mask)
        if HAS_ROW:
            zero_unpartnered(DA, i, n, 0, True, sda_s, REACH, CLIP)
        return
    do = tl.load(DO + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
    out = tl.load(OUT + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
    delta = tl.sum(do.to(tl.float32) * out.to(tl.float32), 1)
    tl.store(DELTA + i, delta, mask=i < n)
    q = tl.load(Q + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
    lse = tl.load(LSE + i, mask=i < n, other=float("inf"))  # rows past n: no probability, so no inf * 0
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    da_low = tl.zeros((BLOCK_M,), tl.float32)
    da_high = tl.zeros((BLOCK_M,), tl.float32)
    seed = seed + bh
    band_first, band_last = band_tiles(i0, n, BLOCK_M, BLOCK_N, REACH)
    left = edge(A, i, n, sa_s, 0, HAS_ROW and CLIP)
    dq, da_low, da_high = query_gradient_tiles(
        dq, da_low, da_high, q, do, lse, delta, i, i0, left, K, V, A, B, KEEP, DA, 0, tl.minimum(band_first, key_end),
        n, key_end, holes, seed, rng_stride,
        p_drop, sk_s, sv_s, sa_s, sb_s, sda_s, scale, 0, REACH, CLIP, HAS_ROW, HAS_KEY, HAS_KEEP, DROPOUT, HEAD_DIM,
        BLOCK_D, BLOCK_N, PRECISION)
    dq, da_low, da_high = query_gradient_tiles(
        dq, da_low, da_high, q, do, lse, delta, i, i0, left, K, V, A, B, KEEP, DA, band_first,
        tl.minimum(band_last, key_end), n, key_end, holes, seed,
        rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, sda_s, scale, 1, REACH, CLIP, HAS_ROW, HAS_KEY, HAS_KEEP,
        DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION)
    right = edge(A, i, n, sa_s, 2 * REACH, HAS_ROW and CLIP)
    dq, da_low, da_high = query_gradient_tiles(
        dq, da_low, da_high, q, do, lse, delta, i, i0, right, K, V, A, B, KEEP, DA, band_last, key_end, n, key_end,
        holes, seed, rng_stride,
        p_drop, sk_s, sv_s, sa_s, sb_s, sda_s, scale, 2, REACH, CLIP, HAS_ROW, HAS_KEY, HAS_KEEP, DROPOUT, HEAD_DIM,
        BLOCK_D, BLOCK_N, PRECISION)
    tl.store(DQ + i[:, None] * sq_s + d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=row_mask)
    if HAS_ROW:
        zero_unpartnered(DA, i, n, key_end, False, sda_s, REACH, CLIP)
        if CLIP:
            store_edges(DA, i, n, sda_s, da_low, da_high, REACH)


@triton.jit
def key_gradient_tiles(dk, dv, db_low, db_high, k, v, j, j0, real, key_edge, Q, DO, LSE, DELTA, A, B, DB, first,
                       last, n, seed, rng_stride, p_drop, sq_s, sa_s, sb_s, sdb_s, scale,
                       MODE: tl.constexpr, REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr,
                       HAS_KEY: tl.constexpr, HAS_KEEP: tl.constexpr, DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr):
    d = tl.arange(0, BLOCK_D)
    for start in range(first, last, BLOCK_M):
        i = start + tl.arange(0, BLOCK_M)
        row_mask = (i < n)[:, None] & (d < HEAD_DIM)[None, :]
        q = tl.load(Q + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
        do = tl.load(DO + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
        # rows past n get no probability (exp2(s - inf) = 0), whatever their scores
        lse = tl.load(LSE + i, mask=i < n, other=float("inf"))
        delta = tl.load(DELTA + i, mask=i < n, other=0.0)
        row_edge = edge(A, i, n, sa_s, 0 if MODE == 0 else 2 * REACH, HAS_ROW and CLIP and MODE != 1)
        p_dropped, ds = gradient_tile(q, k, v, do, lse, delta, A, B, A, i, j, start, j0, row_edge, key_edge, n, n,
                                      False, seed, rng_stride, p_drop, sa_s, sb_s, scale, MODE, REACH, CLIP, HAS_ROW,
                                      HAS_KEY, HAS_KEEP, DROPOUT, PRECISION, False)
        dv += tl.dot(tl.trans(p_dropped.to(do.dtype)), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
        if HAS_KEY:
            # key j's column is c(i - j), summed over the queries (axis 0); keys right of the band sit at 0
            if MODE == 1:
                # pad keys' entries are zeroed at the end (zero_unpartnered), their edge sums discarded
                db_low, db_high = band_table_gradient(DB, ds, j[None, :], i[:, None] - j[None, :],
                                                      real[None, :] & (i < n)[:, None], sdb_s, db_low, db_high, 0,
                                                      REACH, CLIP)
            elif CLIP and MODE == 2:
                db_low += tl.sum(ds, 0)
            elif CLIP:
                db_high += tl.sum(ds, 0)
    return dk, dv, db_low, db_high


@triton.jit(do_not_specialize=["seed", "seqlen", "rng_stride", "length_bucket"])
def key_gradient_kernel(Q, K, V, A, B, KEEP, CU, DO, LSE, DELTA, DK, DV, DB, seed, p_drop, scale, seqlen,
                        rng_stride, heads, sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
                        sa_b, sa_h, sa_s, sb_b, sb_h, sb_s, skeep_b, sl_b, sl_h, sdb_b, sdb_h, sdb_s, length_bucket,
                        REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr,
                        HAS_KEEP: tl.constexpr, VARLEN: tl.constexpr, DROPOUT: tl.constexpr,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """dK, dV and the key table's gradient of one key block; DO is laid out as Q, DK as K, DV as V."""
    block, bh = tl.program_id(0), tl.program_id(1)
    batch, head = bh // heads, bh % heads
    first, n = sequence(CU, batch, seqlen, VARLEN)
    j0 = block * BLOCK_N
    if j0 >= n:
        return
    offset_q = start_of(batch, head, first, sq_b, sq_h, sq_s)
    Q += offset_q
    DO += offset_q
    offset_k = start_of(batch, head, first, sk_b, sk_h, sk_s)
    K += offset_k
    DK += offset_k
    offset_v = start_of(batch, head, first, sv_b, sv_h, sv_s)
    V += offset_v
    DV += offset_v
    A += start_of(batch, head, first, sa_b, sa_h, sa_s)
    B += start_of(batch, head, first, sb_b, sb_h, sb_s)
    DB += start_of(batch, head, first, sdb_b, sdb_h, sdb_s)
    KEEP += batch * skeep_b
    LSE += batch * sl_b + head * sl_h + first
    DELTA += batch * sl_b + head * sl_h + first
    j = j0 + tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    key_mask = (j < n)[:, None] & (d < HEAD_DIM)[None, :]
    key_end, holes = key_extent(KEEP, n, HAS_KEEP)
    if j0 >= key_end:  # padding only: no probability reaches these keys
        zeros = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        tl.store(DK + j[:, None] * sk_s + d[None, :], zeros.to(DK.dtype.element_ty), mask=key_mask)
        tl.store(DV + j[:, None] * sv_s + d[None, :], zeros.to(DV.dtype.element_ty), mask=key_mask)
        if HAS_KEY:
            zero_unpartnered(DB, j, n, n, True, sdb_s, REACH, CLIP)
        return
    # A key's gradients depend on its own column of P and dS alone, and the log-sum-exp came from the forward, so
    # pad keys are not masked tile by tile: their columns are computed, whatever they hold, and discarded at the end.
    real = real_keys(KEEP, j, key_end, holes, HAS_KEEP)
    k = tl.load(K + j[:, None] * sk_s + d[None, :], mask=key_mask, other=0.0)
    v = tl.load(V + j[:, None] * sv_s + d[None, :], mask=key_mask, other=0.0)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    db_low = tl.zeros((BLOCK_N,), tl.float32)
    db_high = tl.zeros((BLOCK_N,), tl.float32)
    seed = seed + bh
    # query tiles for which these keys lie wholly right of the band (i < j - r), touch it, lie wholly left
    band_first, band_last = band_tiles(j0, n, BLOCK_N, BLOCK_M, REACH)
    # keys right of the band sit at column c(i - j) = 0 of their table row, left of it at 2r
    right = edge(B, j, n, sb_s, 0, HAS_KEY and CLIP)
    dk, dv, db_low, db_high = key_gradient_tiles(
        dk, dv, db_low, db_high, k, v, j, j0, real, right, Q, DO, LSE, DELTA, A, B, DB, 0, band_first, n, seed,
        rng_stride, p_drop, sq_s, sa_s, sb_s, sdb_s, scale, 2, REACH, CLIP, HAS_ROW, HAS_KEY, HAS_KEEP, DROPOUT,
        HEAD_DIM, BLOCK_D, BLOCK_M, PRECISION)
    dk, dv, db_low, db_high = key_gradient_tiles(
        dk, dv, db_low, db_high, k, v, j, j0, real, right, Q, DO, LSE, DELTA, A, B, DB, band_first, band_last, n,
        seed,
        rng_stride, p_drop, sq_s, sa_s, sb_s, sdb_s, scale, 1, REACH, CLIP, HAS_ROW, HAS_KEY, HAS_KEEP, DROPOUT,
        HEAD_DIM, BLOCK_D, BLOCK_M, PRECISION)
    left = edge(B, j, n, sb_s, 2 * REACH, HAS_KEY and CLIP)
    dk, dv, db_low, db_high = key_gradient_tiles(
        dk, dv, db_low, db_high, k, v, j, j0, real, left, Q, DO, LSE, DELTA, A, B, DB, band_last, n, n, seed,
        rng_stride, p_drop, sq_s, sa_s, sb_s, sdb_s, scale, 0, REACH, CLIP, HAS_ROW, HAS_KEY, HAS_KEEP, DROPOUT,
        HEAD_DIM, BLOCK_D, BLOCK_M, PRECISION)
    dk = tl.where(real[:, None], dk * scale, 0.0)
    dv = tl.where(real[:, None], dv, 0.0)
    tl.store(DK + j[:, None] * sk_s + d[None, :], dk.to(DK.dtype.element_ty), mask=key_mask)
    tl.store(DV + j[:, None] * sv_s + d[None, :], dv.to(DV.dtype.element_ty), mask=key_mask)
    if HAS_KEY:
        # a pad key's band entries are not stored (band_table_gradient's stored_pairs): all its row is zeroed
        zero_unpartnered(DB, j, n, n, ~real, sdb_s, REACH, CLIP)
        if CLIP:
            store_edges(DB, j, n, sdb_s, tl.where(real, db_low, 0.0), tl.where(real, db_high, 0.0), REACH)


def _configs(kernel: str, head_dim: int, dtype: torch.dtype) -> list[tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for the autotuner to try per kernel ("forward", "query", "key");
    the first alone when interpreting. Half precision with heads of up to 64 channels: the fastest three of ten
    tilings per kernel, timed on an H200 (benchmarks/triton_tuning.py; results/gpu_session/session2/tuning.md) at
    n = 512, 2,048 and 8,192, without terms and with both tables, padding and dropout. float32 and wider heads: from
    ptxas's register report for sm_90 (benchmarks/triton_resources.py), untimed."""
    if interpreting():
        return [(16, 32, 1, 1)]  # the smallest tiles dropout_keep allows
    if dtype == torch.float32 or head_dim > 64:
        return [(64, 32, 4, 2), (32, 64, 4, 2)]
    return {"forward": [(128, 64, 8, 3), (128, 32, 4, 3), (128, 64, 4, 3)],
            "query": [(64, 32, 4, 3), (64, 64, 4, 3), (128, 32, 4, 3)],
            "key": [(64, 64, 4, 3), (32, 64, 4, 3), (16, 128, 4, 3)]}[kernel]


# the autotuners made so far, by (kernel, head size, dtype): what they chose is in their caches
_AUTOTUNERS: dict[tuple[str, int, torch.dtype], triton.runtime.Autotuner] = {}


# what the autotuner keys a tiling on, beside the length bucket
TUNING_KEY = ("REACH", "CLIP", "HAS_ROW", "HAS_KEY", "HAS_KEEP", "VARLEN", "DROPOUT")


def _specialization(args: tuple) -> tuple:
    """What Triton's JIT compiles a launch's runtime arguments for, argument by argument, at a fraction of its
    binder's cost: a tensor's dtype and 16-byte alignment; an integer's being 1, a multiple of 16 and within 32
    bits (for every integer, those the kernels exempt from specialization too: finer than the JIT, never
    coarser); a float's type."""
    return tuple((arg.dtype, arg.data_ptr() % 16 == 0) if isinstance(arg, Tensor)
                 else (arg == 1, arg % 16 == 0, -2**31 <= arg < 2**31) if isinstance(arg, int)
                 else type(arg) for arg in args)


@cache
def _launcher(kernel: str, head_dim: int, dtype: torch.dtype):
    """launch(grid, *args, length_bucket=.., **constexprs): the jitted kernel, autotuned over _configs on a GPU
    (keyed by the length bucket and TUNING_KEY). The autotuner times the tilings at a key's first call; the JIT
    compiles the pick at the first call of each specialization (_specialization); every later call launches that
    binary directly, without the JIT's per-call work on the host (its binder, cache key and launch hooks: about
    half of a launch's host time with our kernels' 40-odd arguments; results/gpu_session/session2/tuning.md)."""
    function = {"forward": forward_kernel, "query": query_gradient_kernel, "key": key_gradient_kernel}[kernel]
    tilings = _configs(kernel, head_dim, dtype)
    if any(m % 16 or n % 32 for m, n, _, _ in tilings):
        raise ValueError(f"BLOCK_M must be a multiple of 16 and BLOCK_N of 32 (dropout_keep's query pairs and key "
                         f"chunks); got {tilings}")
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in tilings]
    if interpreting():
        config = configs[0]
        return lambda grid, *args, **kwargs: function[grid](*args, **config.all_kwargs(), **kwargs)
    tuned = _AUTOTUNERS[kernel, head_dim, dtype] = triton.autotune(configs=configs,
                                                                    key=["length_bucket", *TUNING_KEY])(function)
    picked: dict[tuple, dict] = {}
    binaries: dict[tuple, triton.compiler.CompiledKernel] = {}

    def launch(grid, *args, length_bucket: int, **constants):
        key = (length_bucket, *(constants[name] for name in TUNING_KEY))
        config = picked.get(key)
        if config is None:
            tuned[grid](*args, length_bucket=length_bucket, **constants)
            picked[key] = tuned.best_config.all_kwargs()
            return
        device = triton.runtime.driver.active.get_current_device()
        exact = (device, key, _specialization(args))
        binary = binaries.get(exact)
        if binary is None or triton.knobs.runtime.launch_enter_hook is not None:  # compile, or let a profiler see
            binaries[exact] = function[grid](*args, length_bucket=length_bucket, **constants, **config)
            return
        blocks = grid(config)
        binary.run(blocks[0], blocks[1], 1, triton.runtime.driver.active.get_current_stream(device), binary.function,
                   binary.packed_metadata, None, None, None,
                   *_launch_arguments(function, args, {"length_bucket": length_bucket, **constants, **config}))
    return launch


def _launch_arguments(function: triton.JITFunction, args: tuple, keywords: dict) -> list:
    """Every parameter of the kernel in its order, constexprs included, as the JIT hands them to a binary's
    launcher: the runtime arguments, then the keywords by name (the config's options, which are no parameters,
    left out)."""
    return [*args, *(keywords[name] for name in function.arg_names[len(args):])]


def autotuned_configs() -> list[str]:
    """One line per tiling the autotuner chose so far: the kernel, head size, dtype, its key and the config."""
    return [f"{kernel} d={head_dim} {str(dtype).removeprefix('torch.')} {key}: {config}"
            for (kernel, head_dim, dtype), tuner in _AUTOTUNERS.items() for key, config in tuner.cache.items()]


def _strides(x: Tensor | None, varlen: bool) -> tuple[int, int, int]:
    """(batch, head, position) strides of a padded (b, h, n, c) or packed (total, h, c) operand; 0 where absent or
    broadcast."""
    if x is None:
        return 0, 0, 0
    if varlen:
        return 0, x.stride(1), x.stride(0)
    return (0 if x.shape[0] == 1 else x.stride(0)), x.stride(1), x.stride(2)


def _stats_shape(q: Tensor, varlen: bool) -> tuple[int, ...]:
    """The log-sum-exp's and D's shape: (heads, total) packed, (batch, heads, n) padded."""
    return (q.shape[1], q.shape[0]) if varlen else tuple(q.shape[:3])


def _table_gradient(table: Tensor | None, q: Tensor, varlen: bool) -> Tensor:
    """One row per (sequence, head, position), written whole by the kernels (zero_unpartnered): in the table's
    dtype, or float32 where the table is broadcast over the batch (_as_table sums it). An empty tensor for an absent
    table (an operator returns no None)."""
    if table is None:
        return q.new_empty(0, dtype=torch.float32)
    if varlen or table.shape[0] == q.shape[0]:
        return torch.empty(table.shape, dtype=table.dtype, device=q.device)
    return q.new_empty((q.shape[0], *table.shape[1:]), dtype=torch.float32)


def kernel_dropout_p(p: float) -> float:
    """The rate the kernels drop probabilities at: p to the nearest multiple of 1/256, at least 1/256 where p > 0
    (dropout_keep compares a byte per score, as the flash kernel behind SDPA does with its 1/255)."""
    return 0.0 if p == 0 else min(max(round(p * 256), 1), 255) / 256


class _Problem:
    """Shapes, strides and constexprs shared by the three kernels of one call."""

    def __init__(self, q: Tensor, row_table: Tensor | None, key_table: Tensor | None, keep: Tensor | None,
                 cu_seqlens: Tensor | None, max_seqlen: int, reach: int, clip: bool, dropout_p: float, scale: float,
                 seed: int):
        self.varlen = cu_seqlens is not None
        self.stats_shape = _stats_shape(q, self.varlen)
        if self.varlen:
            total, self.heads, self.head_dim = q.shape
            self.batch, self.seqlen = cu_seqlens.numel() - 1, max_seqlen
            self.stats_strides = (0, total)
        else:
            self.batch, self.heads, self.seqlen, self.head_dim = q.shape
            self.stats_strides = (self.heads * self.seqlen, self.seqlen)
        self.row_table, self.key_table, self.keep, self.cu_seqlens = row_table, key_table, keep, cu_seqlens
        self.scale, self.dropout_p, self.seed = scale, kernel_dropout_p(dropout_p), seed
        self.constants = dict(REACH=reach, CLIP=clip, HAS_ROW=row_table is not None, HAS_KEY=key_table is not None,
                              HAS_KEEP=keep is not None, VARLEN=self.varlen, DROPOUT=dropout_p > 0,
                              HEAD_DIM=self.head_dim, BLOCK_D=max(16, 1 << (self.head_dim - 1).bit_length()),
                              PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
        self.length_bucket = 1 << max(self.seqlen - 1, 0).bit_length()

    def operands(self, q: Tensor) -> list:
        """The pointers every kernel takes after q, k, v: tables, key mask, sequence offsets (q where absent)."""
        return [q if t is None else t for t in (self.row_table, self.key_table, self.keep, self.cu_seqlens)]

    def scalars(self) -> list:
        """seed, p_drop, scale, seqlen, rng_stride (dropout's Philox counters per query pair: four per 32 keys) and
        heads."""
        return [self.seed, self.dropout_p, self.scale, self.seqlen, 4 * -(-self.seqlen // 32), self.heads]

    def keywords(self) -> dict:
        """The constexprs, and length_bucket: the next power of two of the length, which the kernels ignore and the
        autotuner keys on (one tuning per bucket, not per length)."""
        return dict(length_bucket=self.length_bucket, **self.constants)

    def table_strides(self) -> list[int]:
        keep_stride = self.keep.stride(0) if self.keep is not None else 0
        return [*_strides(self.row_table, self.varlen), *_strides(self.key_table, self.varlen), keep_stride,
                *self.stats_strides]

    def forward_arguments(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor) -> list:
        """The forward kernel's runtime arguments, before length_bucket and the constexprs (`keywords`)."""
        return [q, k, v, *self.operands(q), out, lse, *self.scalars(), *_strides(q, self.varlen),
                *_strides(k, self.varlen), *_strides(v, self.varlen), *_strides(out, self.varlen),
                *self.table_strides()]

    def query_arguments(self, q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, out: Tensor, lse: Tensor,
                        delta: Tensor, grad_q: Tensor, grad_row: Tensor | None) -> list:
        """The query-gradient kernel's runtime arguments (grad_row None without a row table); dO and O have q's
        strides."""
        return [q, k, v, *self.operands(q), grad_out, out, lse, delta, grad_q, q if grad_row is None else grad_row,
                *self.scalars(), *self._gradient_strides(q, k, v), *_strides(grad_row, self.varlen)]

    def key_arguments(self, q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, lse: Tensor, delta: Tensor,
                      grad_k: Tensor, grad_v: Tensor, grad_key: Tensor | None) -> list:
        """The key-gradient kernel's runtime arguments (grad_key None without a key table)."""
        return [q, k, v, *self.operands(q), grad_out, lse, delta, grad_k, grad_v,
                q if grad_key is None else grad_key, *self.scalars(), *self._gradient_strides(q, k, v),
                *_strides(grad_key, self.varlen)]

    def _gradient_strides(self, q: Tensor, k: Tensor, v: Tensor) -> list[int]:
        return [*_strides(q, self.varlen), *_strides(k, self.varlen), *_strides(v, self.varlen),
                *self.table_strides()]

    def grid(self, along: str):
        return lambda meta: (-(-self.seqlen // meta[along]), self.batch * self.heads)


def _run_forward(q: Tensor, k: Tensor, v: Tensor, row_table: Tensor | None, key_table: Tensor | None,
                 keep: Tensor | None, cu_seqlens: Tensor | None, seed: int, max_seqlen: int, reach: int, clip: bool,
                 dropout_p: float, scale: float) -> tuple[Tensor, Tensor]:
    """(out, log2-sum-exp of every query row in float32)."""
    problem = _Problem(q, row_table, key_table, keep, cu_seqlens, max_seqlen, reach, clip, dropout_p, scale, seed)
    out = torch.empty_like(q)
    lse = torch.empty(problem.stats_shape, dtype=torch.float32, device=q.device)
    launch = _launcher("forward", problem.head_dim, q.dtype)
    launch(problem.grid("BLOCK_M"), *problem.forward_arguments(q, k, v, out, lse), **problem.keywords())
    return out, lse


def _run_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  row_table: Tensor | None, key_table: Tensor | None, keep: Tensor | None, cu_seqlens: Tensor | None,
                  seed: int, max_seqlen: int, reach: int, clip: bool, dropout_p: float,
                  scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, d row table, d key table), the tables' in float32 per (sequence, head, position)."""
    problem = _Problem(q, row_table, key_table, keep, cu_seqlens, max_seqlen, reach, clip, dropout_p, scale, seed)
    # the query kernel reads dO and O with q's strides
    grad_out, out = (x if x.stride() == q.stride() else torch.empty_like(q).copy_(x) for x in (grad_out, out))
    delta = torch.empty(problem.stats_shape, dtype=torch.float32, device=q.device)  # the query kernel fills it
    grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grad_row, grad_key = (_table_gradient(table, q, problem.varlen) for table in (row_table, key_table))
    _launcher("query", problem.head_dim, q.dtype)(
        problem.grid("BLOCK_M"), *problem.query_arguments(q, k, v, grad_out, out, lse, delta, grad_q,
                                                          grad_row if row_table is not None else None),
        **problem.keywords())
    _launcher("key", problem.head_dim, q.dtype)(
        problem.grid("BLOCK_N"), *problem.key_arguments(q, k, v, grad_out, lse, delta, grad_k, grad_v,
                                                        grad_key if key_table is not None else None),
        **problem.keywords())
    return grad_q, grad_k, grad_v, grad_row, grad_key


# The kernels as two operators (torch.library), so that torch.compile keeps them whole in its graphs; the seed is a
# CPU tensor drawn in the graph, so a compiled step draws a fresh one each time instead of a constant.

@torch.library.custom_op("convattn::triton_relative_attention", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, row_table: Tensor | None, key_table: Tensor | None,
             keep: Tensor | None, cu_seqlens: Tensor | None, seed: Tensor, max_seqlen: int, reach: int, clip: bool,
             dropout_p: float, scale: float) -> tuple[Tensor, Tensor]:
    return _run_forward(q, k, v, row_table, key_table, keep, cu_seqlens, int(seed), max_seqlen, reach, clip,
                        dropout_p, scale)


@_forward.register_fake
def _(q, k, v, row_table, key_table, keep, cu_seqlens, seed, max_seqlen, reach, clip, dropout_p, scale):
    return torch.empty_like(q), q.new_empty(_stats_shape(q, cu_seqlens is not None), dtype=torch.float32)


@torch.library.custom_op("convattn::triton_relative_attention_backward", mutates_args=())
def _backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, row_table: Tensor | None,
              key_table: Tensor | None, keep: Tensor | None, cu_seqlens: Tensor | None, seed: Tensor,
              max_seqlen: int, reach: int, clip: bool, dropout_p: float,
              scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return _run_backward(grad_out, q, k, v, out, lse, row_table, key_table, keep, cu_seqlens, int(seed), max_seqlen,
                         reach, clip, dropout_p, scale)


@_backward.register_fake
def _(grad_out, q, k, v, out, lse, row_table, key_table, keep, cu_seqlens, seed, max_seqlen, reach, clip,
      dropout_p, scale):
    varlen = cu_seqlens is not None
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), _table_gradient(row_table, q, varlen),
            _table_gradient(key_table, q, varlen))


def _setup_context(ctx, inputs, output):
    q, k, v, row_table, key_table, keep, cu_seqlens, seed, *ctx.options = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], row_table, key_table, keep, cu_seqlens, seed)
    ctx.table_shapes = _shapes(row_table, key_table)


def _differentiate(ctx, grad_out, grad_lse):
    q, k, v, out, lse, row_table, key_table, keep, cu_seqlens, seed = ctx.saved_tensors
    grads = _backward(grad_out, q, k, v, out, lse, row_table, key_table, keep, cu_seqlens, seed, *ctx.options)
    return *_as_inputs(grads, ctx.table_shapes), None, None, None, None, None, None, None, None


_forward.register_autograd(_differentiate, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The operators' twin outside graphs: the same kernels behind an autograd.Function, which costs the host less
    per call than a custom operator's dispatch and autograd wrapper (pytorch/pytorch#139500)."""

    @staticmethod
    def forward(ctx, q, k, v, row_table, key_table, keep, cu_seqlens, seed: int, *options):
        out, lse = _run_forward(q, k, v, row_table, key_table, keep, cu_seqlens, seed, *options)
        ctx.save_for_backward(q, k, v, out, lse, row_table, key_table, keep, cu_seqlens)
        ctx.seed, ctx.options, ctx.table_shapes = seed, options, _shapes(row_table, key_table)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, row_table, key_table, keep, cu_seqlens = ctx.saved_tensors
        grads = _run_backward(grad_out, q, k, v, out, lse, row_table, key_table, keep, cu_seqlens, ctx.seed,
                              *ctx.options)
        return *_as_inputs(grads, ctx.table_shapes), None, None, None, None, None, None, None, None


def _shapes(*tables: Tensor | None) -> list:
    return [None if t is None else (t.shape, t.dtype) for t in tables]


def _as_inputs(grads: tuple[Tensor, ...], table_shapes: list) -> tuple:
    """dq, dk, dv and each table's gradient in its own shape and dtype (summed over the batch a broadcast table was
    shared by; None for an absent table)."""
    *grad_qkv, grad_row, grad_key = grads
    return *grad_qkv, *(_as_table(grad, shape) for grad, shape in zip((grad_row, grad_key), table_shapes,
                                                                        strict=True))


def _as_table(grad: Tensor, shape_and_dtype) -> Tensor | None:
    if shape_and_dtype is None:
        return None
    shape, dtype = shape_and_dtype
    if grad.shape != shape:
        grad = grad.sum(0, keepdim=True)
    return grad.to(dtype)


def triton_relative_attention(q: Tensor, k: Tensor, v: Tensor, row_table: Tensor | None, key_table: Tensor | None,
                              *, reach: int, clip: bool, keep: Tensor | None = None, dropout_p: float = 0.0,
                              cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                              scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale + relative terms [+ pad keys masked]) with dropout, times v, in one fused kernel.

    Padded: q, k, v (batch, heads, n, d), row_table (batch or 1, heads, n, 2r + 1) at [i, c(j - i)], key_table
    (batch, heads, n, 2r + 1) at [j, c(i - j)], keep (batch, n) bool. Packed: q, k, v (total, heads, d), tables
    (total, heads, 2r + 1), cu_seqlens (batch + 1,) int32 offsets of the sequences and max_seqlen their longest
    length. Either table may be None. scale defaults to 1 / sqrt(d). Gradients flow to q, k, v and both tables.
    Dropout drops at kernel_dropout_p(dropout_p), the nearest multiple of 1/256.
    """
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q.dtype must be float16, bfloat16 or float32 for the Triton kernel; got {q.dtype}")
    if q.device.type != ("cpu" if interpreting() else "cuda"):
        raise RuntimeError(f"the Triton kernel runs on CUDA, or on CPU under TRITON_INTERPRET=1; got {q.device}")
    if cu_seqlens is not None and keep is not None:
        raise ValueError("keep and cu_seqlens are exclusive: packed sequences have no padding")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p}")
    if scale == 0:  # the band's terms enter the product divided by it (score_tile)
        raise ValueError("scale must be nonzero (None for 1 / sqrt(d)); got 0")
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(torch.int32)
        max_seqlen = int(max_seqlen if max_seqlen is not None else (cu_seqlens[1:] - cu_seqlens[:-1]).max())
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    row_table, key_table = (t if t is None or t.stride(-1) == 1 else t.contiguous() for t in (row_table, key_table))
    if keep is not None:
        keep = keep.to(torch.uint8) if keep.dtype != torch.bool else keep.view(torch.uint8)
    seed = torch.randint(0, 2**30, ()) if dropout_p > 0 else torch.zeros((), dtype=torch.int64)
    options = (max_seqlen or 0, reach, clip, dropout_p, q.shape[-1] ** -0.5 if scale is None else scale)
    if is_tracing():
        return _forward(q, k, v, row_table, key_table, keep, cu_seqlens, seed, *options)[0]
    return _EagerAttention.apply(q, k, v, row_table, key_table, keep, cu_seqlens, int(seed), *options)
