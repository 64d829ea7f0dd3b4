"""The fused kernel's device code, and nothing else: Triton functions that launch.py tiles and launches.

A score in log2 units (times log2 e, for exp2) is

    s_ij = (q_i . k_j * scale + A[i, c(j - i)] + B[j, c(i - j)]) * log2 e,    c(t) = clamp(t, -r, r) + r,

A the row table, B the key table (either may be absent; in "zero" mode, CLIP false, the terms vanish where
|j - i| > r). Seen from a tile of queries, the key tiles fall in three regions: LEFT, wholly left of the band (every
key j < i - r: only A[i, 0] + B[j, 2r] in clip mode), BAND, touching it (the tables' columns gathered per score), and
RIGHT, wholly right of it (j > i + r: only A[i, 2r] + B[j, 0]). Every loop over tiles runs region by region, so the
gather is paid on about (BLOCK_M + 2r) / BLOCK_N tiles per query block.

Compile-time constants (tl.constexpr, upper case) are passed by keyword.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)

# where a tile of keys lies from a tile of queries (and the reverse, from the queries' side): see the docstring
LEFT = tl.constexpr(0)
BAND = tl.constexpr(1)
RIGHT = tl.constexpr(2)


# ---------------------------------------------------------------------------------------------------------------------
# relative terms


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


@triton.jit
def edge(T, rows, n, s_s, COLUMN: tl.constexpr, HAS: tl.constexpr):
    """T[rows, COLUMN] in float32 and log2 units (times log2 e), 0 where absent."""
    if HAS:
        return tl.load(T + rows * s_s + COLUMN, mask=rows < n, other=0.0).to(tl.float32) * LOG2E
    return (rows * 0).to(tl.float32)


@triton.jit
def score_tile(q, k, A, B, i, j, row_edge, key_edge, n, sa_s, sb_s, scale, REGION: tl.constexpr,
               REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr,
               PRECISION: tl.constexpr):
    """Scores in log2 units of queries i (BLOCK_M,) and keys j (BLOCK_N,) of one REGION; the edges (a LEFT or RIGHT
    tile's terms) come in log2 units."""
    if REGION == BAND and (HAS_ROW or HAS_KEY):
        # The gathered terms enter as the product's accumulator, in q . k units. Added to the product's result
        # instead, the gather's own layout spread from them into the softmax, which Triton then computed twice,
        # once per layout, with the tile converted between them through shared memory.
        bias = band_bias(A, B, i[:, None], j[None, :], n, sa_s, sb_s, REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW,
                         HAS_KEY=HAS_KEY) * (1.0 / scale)
        return tl.dot(q, tl.trans(k), acc=bias, input_precision=PRECISION) * (scale * LOG2E)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * (scale * LOG2E)
    if REGION != BAND and CLIP and (HAS_ROW or HAS_KEY):
        s += row_edge[:, None] + key_edge[None, :]
    return s


# ---------------------------------------------------------------------------------------------------------------------
# dropout


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
def dropout_seed(SEED, bh, DROPOUT: tl.constexpr):
    """The Philox key of (batch, head) number bh: the seed torch drew for the call on the operands' device (SEED,
    read only with dropout), plus bh."""
    if DROPOUT:
        return tl.load(SEED) + bh
    return bh.to(tl.int64)  # unused: one return type for both


# ---------------------------------------------------------------------------------------------------------------------
# sequences, padding and tiles


@triton.jit
def sequence(CU, batch, seqlen, VARLEN: tl.constexpr):
    """(first, n): where a sequence starts among packed tokens (0 padded) and its length."""
    if VARLEN:
        first = tl.load(CU + batch)
        return first, tl.load(CU + batch + 1) - first
    return 0, seqlen


@triton.jit
def start_of(batch, head, first, s_b, s_h, s_s):
    """Where (batch, head)'s sequence starts in an operand with those strides (first: its packed offset)."""
    return batch * s_b + head * s_h + first * s_s


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
        s = tl.where(real_keys(KEEP, j, key_end, holes, HAS_KEEP=HAS_KEEP)[None, :], s, -1.0e30)
    return s


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


# ---------------------------------------------------------------------------------------------------------------------
# forward


@triton.jit
def forward_region(acc, m_i, l_i, q, i, i0, row_edge, K, V, A, B, KEEP, first, last, n, key_end, holes, seed,
                   rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, scale, REGION: tl.constexpr, REACH: tl.constexpr,
                   CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr, HAS_KEEP: tl.constexpr,
                   DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                   PRECISION: tl.constexpr):
    """The online softmax (FlashAttention-2) over the key tiles first .. last of one REGION."""
    d = tl.arange(0, BLOCK_D)
    for start in range(first, last, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        operand_mask = (j < n)[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(K + j[:, None] * sk_s + d[None, :], mask=operand_mask, other=0.0)
        key_edge = edge(B, j, n, sb_s, COLUMN=0 if REGION == RIGHT else 2 * REACH,
                        HAS=HAS_KEY and CLIP and REGION != BAND)
        s = score_tile(q, k, A, B, i, j, row_edge, key_edge, n, sa_s, sb_s, scale, REGION=REGION, REACH=REACH,
                       CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, PRECISION=PRECISION)
        s = mask_pads(s, KEEP, j, start, key_end, holes, HAS_KEEP=HAS_KEEP)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            p = tl.where(dropout_keep(seed, i0, start, rng_stride, p_drop, BLOCK_M=i.shape[0], BLOCK_N=BLOCK_N), p,
                         0.0)
        v = tl.load(V + j[:, None] * sv_s + d[None, :], mask=operand_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["seqlen", "rng_stride", "length_bucket"])
def forward_kernel(Q, K, V, A, B, KEEP, CU, SEED, OUT, LSE, p_drop, scale, seqlen, rng_stride, heads,
                   sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h, so_s,
                   sa_b, sa_h, sa_s, sb_b, sb_h, sb_s, skeep_b, sl_b, sl_h, length_bucket,
                   REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr,
                   HAS_KEEP: tl.constexpr, VARLEN: tl.constexpr, DROPOUT: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """The output of one query block and its rows' log2-sum-exp (LSE), which the backward reads."""
    block, bh = tl.program_id(0), tl.program_id(1)
    batch, head = bh // heads, bh % heads
    first, n = sequence(CU, batch, seqlen, VARLEN=VARLEN)
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
    key_end, holes = key_extent(KEEP, n, HAS_KEEP=HAS_KEEP)
    if key_end == 0:
        tl.store(OUT + i[:, None] * so_s + d[None, :], tl.zeros((BLOCK_M, BLOCK_D), OUT.dtype.element_ty),
                 mask=row_mask)
        tl.store(LSE + i, tl.zeros((BLOCK_M,), tl.float32), mask=i < n)
        return
    q = tl.load(Q + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    seed = dropout_seed(SEED, bh, DROPOUT=DROPOUT)
    band_first, band_last = band_tiles(i0, n, SIZE=BLOCK_M, OTHER=BLOCK_N, REACH=REACH)
    left = edge(A, i, n, sa_s, COLUMN=0, HAS=HAS_ROW and CLIP)
    right = edge(A, i, n, sa_s, COLUMN=2 * REACH, HAS=HAS_ROW and CLIP)
    acc, m_i, l_i = forward_region(acc, m_i, l_i, q, i, i0, left, K, V, A, B, KEEP, 0,
                                   tl.minimum(band_first, key_end), n, key_end, holes, seed, rng_stride, p_drop,
                                   sk_s, sv_s, sa_s, sb_s, scale, REGION=LEFT, REACH=REACH, CLIP=CLIP,
                                   HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_KEEP=HAS_KEEP, DROPOUT=DROPOUT,
                                   HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, PRECISION=PRECISION)
    acc, m_i, l_i = forward_region(acc, m_i, l_i, q, i, i0, left, K, V, A, B, KEEP, band_first,
                                   tl.minimum(band_last, key_end), n, key_end, holes, seed, rng_stride, p_drop,
                                   sk_s, sv_s, sa_s, sb_s, scale, REGION=BAND, REACH=REACH, CLIP=CLIP,
                                   HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_KEEP=HAS_KEEP, DROPOUT=DROPOUT,
                                   HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, PRECISION=PRECISION)
    acc, m_i, l_i = forward_region(acc, m_i, l_i, q, i, i0, right, K, V, A, B, KEEP, band_last, key_end, n,
                                   key_end, holes, seed, rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, scale,
                                   REGION=RIGHT, REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY,
                                   HAS_KEEP=HAS_KEEP, DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
                                   BLOCK_N=BLOCK_N, PRECISION=PRECISION)
    out = acc / l_i[:, None]
    if DROPOUT:
        out = out / (1.0 - p_drop)
    tl.store(OUT + i[:, None] * so_s + d[None, :], out.to(OUT.dtype.element_ty), mask=row_mask)
    tl.store(LSE + i, m_i + tl.log2(l_i), mask=i < n)


# ---------------------------------------------------------------------------------------------------------------------
# backward: dS_ij = P_ij (dP_ij - D_i), D_i = dO_i . O_i (Dao et al. 2022, Appendix B.2)


@triton.jit
def gradient_tile(q, k, v, do, lse, delta, A, B, KEEP, i, j, query_start, key_start, row_edge, key_edge, n, key_end,
                  holes, seed, rng_stride, p_drop, sa_s, sb_s, scale, REGION: tl.constexpr, REACH: tl.constexpr,
                  CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr, HAS_KEEP: tl.constexpr,
                  DROPOUT: tl.constexpr, PRECISION: tl.constexpr, MASK_PADS: tl.constexpr):
    """(P with dropout applied, dS) of a (BLOCK_M, BLOCK_N) tile; without MASK_PADS, the columns of pad keys are
    left unmasked (any value, inf or NaN included) for the caller to discard."""
    s = score_tile(q, k, A, B, i, j, row_edge, key_edge, n, sa_s, sb_s, scale, REGION=REGION, REACH=REACH,
                   CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, PRECISION=PRECISION)
    if MASK_PADS:
        s = mask_pads(s, KEEP, j, key_start, key_end, holes, HAS_KEEP=HAS_KEEP)
    p = tl.exp2(s - lse[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    if DROPOUT:
        keep = dropout_keep(seed, query_start, key_start, rng_stride, p_drop, BLOCK_M=i.shape[0],
                            BLOCK_N=j.shape[0])
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
def query_gradient_region(dq, da_low, da_high, q, do, lse, delta, i, i0, row_edge, K, V, A, B, KEEP, DA, first,
                          last, n, key_end, holes, seed, rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, sda_s, scale,
                          REGION: tl.constexpr, REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr,
                          HAS_KEY: tl.constexpr, HAS_KEEP: tl.constexpr, DROPOUT: tl.constexpr,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                          PRECISION: tl.constexpr):
    d = tl.arange(0, BLOCK_D)
    for start in range(first, last, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        operand_mask = (j < n)[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(K + j[:, None] * sk_s + d[None, :], mask=operand_mask, other=0.0)
        v = tl.load(V + j[:, None] * sv_s + d[None, :], mask=operand_mask, other=0.0)
        key_edge = edge(B, j, n, sb_s, COLUMN=0 if REGION == RIGHT else 2 * REACH,
                        HAS=HAS_KEY and CLIP and REGION != BAND)
        _, ds = gradient_tile(q, k, v, do, lse, delta, A, B, KEEP, i, j, i0, start, row_edge, key_edge, n, key_end,
                              holes, seed, rng_stride, p_drop, sa_s, sb_s, scale, REGION=REGION, REACH=REACH,
                              CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_KEEP=HAS_KEEP, DROPOUT=DROPOUT,
                              PRECISION=PRECISION, MASK_PADS=True)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        if HAS_ROW:
            if REGION == BAND:
                da_low, da_high = band_table_gradient(DA, ds, i[:, None], j[None, :] - i[:, None],
                                                      (i < n)[:, None] & (j < n)[None, :], sda_s, da_low, da_high,
                                                      AXIS=1, REACH=REACH, CLIP=CLIP)
            elif CLIP and REGION == LEFT:
                da_low += tl.sum(ds, 1)
            elif CLIP:
                da_high += tl.sum(ds, 1)
    return dq, da_low, da_high


@triton.jit(do_not_specialize=["seqlen", "rng_stride", "length_bucket"])
def query_gradient_kernel(Q, K, V, A, B, KEEP, CU, SEED, DO, OUT, LSE, DELTA, DQ, DA, p_drop, scale, seqlen,
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
    first, n = sequence(CU, batch, seqlen, VARLEN=VARLEN)
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
    key_end, holes = key_extent(KEEP, n, HAS_KEEP=HAS_KEEP)
    if key_end == 0:  # D_i is read by the key kernel only for keys that this sequence lacks
        tl.store(DQ + i[:, None] * sq_s + d[None, :], tl.zeros((BLOCK_M, BLOCK_D), DQ.dtype.element_ty),
                 mask=row_mask)
        if HAS_ROW:
            zero_unpartnered(DA, i, n, 0, True, sda_s, REACH=REACH, CLIP=CLIP)
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
    seed = dropout_seed(SEED, bh, DROPOUT=DROPOUT)
    band_first, band_last = band_tiles(i0, n, SIZE=BLOCK_M, OTHER=BLOCK_N, REACH=REACH)
    left = edge(A, i, n, sa_s, COLUMN=0, HAS=HAS_ROW and CLIP)
    right = edge(A, i, n, sa_s, COLUMN=2 * REACH, HAS=HAS_ROW and CLIP)
    dq, da_low, da_high = query_gradient_region(
        dq, da_low, da_high, q, do, lse, delta, i, i0, left, K, V, A, B, KEEP, DA, 0, tl.minimum(band_first, key_end),
        n, key_end, holes, seed, rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, sda_s, scale, REGION=LEFT, REACH=REACH,
        CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_KEEP=HAS_KEEP, DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM,
        BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, PRECISION=PRECISION)
    dq, da_low, da_high = query_gradient_region(
        dq, da_low, da_high, q, do, lse, delta, i, i0, left, K, V, A, B, KEEP, DA, band_first,
        tl.minimum(band_last, key_end), n, key_end, holes, seed, rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, sda_s,
        scale, REGION=BAND, REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_KEEP=HAS_KEEP,
        DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, PRECISION=PRECISION)
    dq, da_low, da_high = query_gradient_region(
        dq, da_low, da_high, q, do, lse, delta, i, i0, right, K, V, A, B, KEEP, DA, band_last, key_end, n, key_end,
        holes, seed, rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, sda_s, scale, REGION=RIGHT, REACH=REACH, CLIP=CLIP,
        HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_KEEP=HAS_KEEP, DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
        BLOCK_N=BLOCK_N, PRECISION=PRECISION)
    tl.store(DQ + i[:, None] * sq_s + d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=row_mask)
    if HAS_ROW:
        zero_unpartnered(DA, i, n, key_end, False, sda_s, REACH=REACH, CLIP=CLIP)
        if CLIP:
            store_edges(DA, i, n, sda_s, da_low, da_high, REACH=REACH)


@triton.jit
def key_gradient_region(dk, dv, db_low, db_high, k, v, j, j0, real, key_edge, Q, DO, LSE, DELTA, A, B, DB, first,
                        last, n, seed, rng_stride, p_drop, sq_s, sa_s, sb_s, sdb_s, scale,
                        REGION: tl.constexpr, REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr,
                        HAS_KEY: tl.constexpr, HAS_KEEP: tl.constexpr, DROPOUT: tl.constexpr,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                        PRECISION: tl.constexpr):
    """The query tiles first .. last, for which the key block lies in REGION (from the queries' side)."""
    d = tl.arange(0, BLOCK_D)
    for start in range(first, last, BLOCK_M):
        i = start + tl.arange(0, BLOCK_M)
        row_mask = (i < n)[:, None] & (d < HEAD_DIM)[None, :]
        q = tl.load(Q + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
        do = tl.load(DO + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
        # rows past n get no probability (exp2(s - inf) = 0), whatever their scores
        lse = tl.load(LSE + i, mask=i < n, other=float("inf"))
        delta = tl.load(DELTA + i, mask=i < n, other=0.0)
        row_edge = edge(A, i, n, sa_s, COLUMN=0 if REGION == LEFT else 2 * REACH,
                        HAS=HAS_ROW and CLIP and REGION != BAND)
        p_dropped, ds = gradient_tile(q, k, v, do, lse, delta, A, B, A, i, j, start, j0, row_edge, key_edge, n, n,
                                      False, seed, rng_stride, p_drop, sa_s, sb_s, scale, REGION=REGION, REACH=REACH,
                                      CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_KEEP=HAS_KEEP,
                                      DROPOUT=DROPOUT, PRECISION=PRECISION, MASK_PADS=False)
        dv += tl.dot(tl.trans(p_dropped.to(do.dtype)), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
        if HAS_KEY:
            # key j's column is c(i - j), summed over the queries (axis 0); keys right of the band sit at 0
            if REGION == BAND:
                # pad keys' entries are zeroed at the end (zero_unpartnered), their edge sums discarded
                db_low, db_high = band_table_gradient(DB, ds, j[None, :], i[:, None] - j[None, :],
                                                      real[None, :] & (i < n)[:, None], sdb_s, db_low, db_high,
                                                      AXIS=0, REACH=REACH, CLIP=CLIP)
            elif CLIP and REGION == RIGHT:
                db_low += tl.sum(ds, 0)
            elif CLIP:
                db_high += tl.sum(ds, 0)
    return dk, dv, db_low, db_high


@triton.jit(do_not_specialize=["seqlen", "rng_stride", "length_bucket"])
def key_gradient_kernel(Q, K, V, A, B, KEEP, CU, SEED, DO, LSE, DELTA, DK, DV, DB, p_drop, scale, seqlen,
                        rng_stride, heads, sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
                        sa_b, sa_h, sa_s, sb_b, sb_h, sb_s, skeep_b, sl_b, sl_h, sdb_b, sdb_h, sdb_s, length_bucket,
                        REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr,
                        HAS_KEEP: tl.constexpr, VARLEN: tl.constexpr, DROPOUT: tl.constexpr,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """dK, dV and the key table's gradient of one key block; DO is laid out as Q, DK as K, DV as V."""
    block, bh = tl.program_id(0), tl.program_id(1)
    batch, head = bh // heads, bh % heads
    first, n = sequence(CU, batch, seqlen, VARLEN=VARLEN)
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
    key_end, holes = key_extent(KEEP, n, HAS_KEEP=HAS_KEEP)
    if j0 >= key_end:  # padding only: no probability reaches these keys
        zeros = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        tl.store(DK + j[:, None] * sk_s + d[None, :], zeros.to(DK.dtype.element_ty), mask=key_mask)
        tl.store(DV + j[:, None] * sv_s + d[None, :], zeros.to(DV.dtype.element_ty), mask=key_mask)
        if HAS_KEY:
            zero_unpartnered(DB, j, n, n, True, sdb_s, REACH=REACH, CLIP=CLIP)
        return
    # A key's gradients depend on its own column of P and dS alone, and the log-sum-exp came from the forward, so
    # pad keys are not masked tile by tile: their columns are computed, whatever they hold, and discarded at the end.
    real = real_keys(KEEP, j, key_end, holes, HAS_KEEP=HAS_KEEP)
    k = tl.load(K + j[:, None] * sk_s + d[None, :], mask=key_mask, other=0.0)
    v = tl.load(V + j[:, None] * sv_s + d[None, :], mask=key_mask, other=0.0)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    db_low = tl.zeros((BLOCK_N,), tl.float32)
    db_high = tl.zeros((BLOCK_N,), tl.float32)
    seed = dropout_seed(SEED, bh, DROPOUT=DROPOUT)
    # query tiles for which these keys lie wholly right of the band (i < j - r), touch it, lie wholly left
    band_first, band_last = band_tiles(j0, n, SIZE=BLOCK_N, OTHER=BLOCK_M, REACH=REACH)
    # keys right of the band sit at column c(i - j) = 0 of their table row, left of it at 2r
    right = edge(B, j, n, sb_s, COLUMN=0, HAS=HAS_KEY and CLIP)
    left = edge(B, j, n, sb_s, COLUMN=2 * REACH, HAS=HAS_KEY and CLIP)
    dk, dv, db_low, db_high = key_gradient_region(
        dk, dv, db_low, db_high, k, v, j, j0, real, right, Q, DO, LSE, DELTA, A, B, DB, 0, band_first, n, seed,
        rng_stride, p_drop, sq_s, sa_s, sb_s, sdb_s, scale, REGION=RIGHT, REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW,
        HAS_KEY=HAS_KEY, HAS_KEEP=HAS_KEEP, DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
        PRECISION=PRECISION)
    dk, dv, db_low, db_high = key_gradient_region(
        dk, dv, db_low, db_high, k, v, j, j0, real, right, Q, DO, LSE, DELTA, A, B, DB, band_first, band_last, n,
        seed, rng_stride, p_drop, sq_s, sa_s, sb_s, sdb_s, scale, REGION=BAND, REACH=REACH, CLIP=CLIP,
        HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_KEEP=HAS_KEEP, DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
        BLOCK_M=BLOCK_M, PRECISION=PRECISION)
    dk, dv, db_low, db_high = key_gradient_region(
        dk, dv, db_low, db_high, k, v, j, j0, real, left, Q, DO, LSE, DELTA, A, B, DB, band_last, n, n, seed,
        rng_stride, p_drop, sq_s, sa_s, sb_s, sdb_s, scale, REGION=LEFT, REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW,
        HAS_KEY=HAS_KEY, HAS_KEEP=HAS_KEEP, DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
        PRECISION=PRECISION)
    dk = tl.where(real[:, None], dk * scale, 0.0)
    dv = tl.where(real[:, None], dv, 0.0)
    tl.store(DK + j[:, None] * sk_s + d[None, :], dk.to(DK.dtype.element_ty), mask=key_mask)
    tl.store(DV + j[:, None] * sv_s + d[None, :], dv.to(DV.dtype.element_ty), mask=key_mask)
    if HAS_KEY:
        # a pad key's band entries are not stored (band_table_gradient's stored_pairs): all its row is zeroed
        zero_unpartnered(DB, j, n, n, ~real, sdb_s, REACH=REACH, CLIP=CLIP)
        if CLIP:
            store_edges(DB, j, n, sdb_s, tl.where(real, db_low, 0.0), tl.where(real, db_high, 0.0), REACH=REACH)
