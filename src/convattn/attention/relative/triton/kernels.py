"""The fused kernel's device code, and nothing else: Triton functions that launch.py tiles and launches.

A score in log2 units (times log2 e, for exp2) is

    s_ij = (q_i . k_j * scale + A[i, c(j - i)] + B[j, c(i - j)]) * log2 e,    c(t) = clamp(t, -r, r) + r,

A the row table, B the key table (either may be absent; in "zero" mode, CLIP false, the terms vanish where
|j - i| > r). Seen from a tile of queries, the key tiles fall in three regions: LEFT, wholly left of the band (every
key j < i - r: only A[i, 0] + B[j, 2r] in clip mode), BAND, touching it (the tables' columns gathered per score), and
RIGHT, wholly right of it (j > i + r: only A[i, 2r] + B[j, 0]). Every loop over tiles runs region by region, so the
gather is paid on about (BLOCK_M + 2r) / BLOCK_N tiles per query block.

With HAS_ALIBI, every score of every region also gets ALiBi's -m_h |i - j| in float32 (FlashAttention's ALiBi): m_h
the head's slope (SLOPES, read once per program), i and j the positions within the sequence (a packed sequence's
offsets from its start). It is computed from the positions, no table read, in the forward and in the backward's
recomputed scores. Without it nothing of the term is compiled: SLOPES is then a pointer the kernels never read.

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
    and keys past n read row n - 1 instead of a mask per score: their scores are masked or discarded (the
    backward gives rows past n no probability)."""
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
def alibi_slope(SLOPES, head, HAS_ALIBI: tl.constexpr):
    """ALiBi's slope m_h of `head` in float32 and log2 units (times log2 e); 0 without ALiBi (SLOPES not read)."""
    if HAS_ALIBI:
        return tl.load(SLOPES + head).to(tl.float32) * LOG2E
    return (head * 0).to(tl.float32)  # unused: one return type for both


@triton.jit
def score_tile(q, k, A, B, i, j, row_edge, key_edge, slope, n, sa_s, sb_s, scale, REGION: tl.constexpr,
               REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr,
               HAS_ALIBI: tl.constexpr, PRECISION: tl.constexpr):
    """Scores in log2 units of queries i (BLOCK_M,) and keys j (BLOCK_N,) of one REGION; the edges (a LEFT or RIGHT
    tile's terms) and ALiBi's slope come in log2 units."""
    if REGION == BAND and (HAS_ROW or HAS_KEY):
        # The gathered terms enter as the product's accumulator, in q . k units. Added to the product's result
        # instead, the gather's own layout spread from them into the softmax, which Triton then computed twice,
        # once per layout, with the tile converted between them through shared memory.
        bias = band_bias(A, B, i[:, None], j[None, :], n, sa_s, sb_s, REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW,
                         HAS_KEY=HAS_KEY) * (1.0 / scale)
        s = tl.dot(q, tl.trans(k), acc=bias, input_precision=PRECISION) * (scale * LOG2E)
    else:
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * (scale * LOG2E)
        if REGION != BAND and CLIP and (HAS_ROW or HAS_KEY):
            s += row_edge[:, None] + key_edge[None, :]
    if HAS_ALIBI:
        # From two ranges, no load: nothing ties the term to a layout, so it is computed in the product's. The
        # positions are converted per row and per key, not per score (exact below 2^24), leaving a subtraction and a
        # multiply-add per score, the absolute value an operand modifier. Rows past n and pad keys get finite terms;
        # they are discarded or masked as without ALiBi.
        s -= slope * tl.abs(i.to(tl.float32)[:, None] - j.to(tl.float32)[None, :])
    return s


@triton.jit
def project_rows(X, FIXED, W, T, i, n, head, sx_s, st_s, table_scale, HAS_FIXED: tl.constexpr, WIDTH: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_W: tl.constexpr, PRECISION: tl.constexpr):
    """T[i, t] = FIXED[head, t] + X_i . W[:, t] * table_scale for the rows i (< n) and columns t < WIDTH, in one
    product and one rounding to T's dtype: the row table (fixed and the query kernel, from the queries) or the key
    table (the key kernel, from the keys). W (HEAD_DIM, WIDTH) and FIXED (heads, WIDTH) are contiguous; W is
    rounded to X's dtype first, as the torch path's product does."""
    c = tl.arange(0, BLOCK_W)
    d = tl.arange(0, BLOCK_D)
    columns = (c < WIDTH)[None, :]
    x = tl.load(X + i[:, None] * sx_s + d[None, :], mask=(i < n)[:, None] & (d < HEAD_DIM)[None, :], other=0.0)
    w = tl.load(W + d[:, None] * WIDTH + c[None, :], mask=(d < HEAD_DIM)[:, None] & columns, other=0.0)
    table = tl.dot(x, w.to(x.dtype), input_precision=PRECISION) * table_scale
    if HAS_FIXED:
        table += tl.load(FIXED + head * WIDTH + c, mask=c < WIDTH, other=0.0).to(tl.float32)[None, :]
    tl.store(T + i[:, None] * st_s + c[None, :], table.to(T.dtype.element_ty), mask=(i < n)[:, None] & columns)


@triton.jit(do_not_specialize=["rows"])
def tables_kernel(Q, K, FIXED, WQ, WK, A, B, table_scale, rows, heads, sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sa_b,
                  sa_h, sa_s, sb_b, sb_h, sb_s, BUILD_ROW: tl.constexpr, BUILD_KEY: tl.constexpr,
                  HAS_FIXED: tl.constexpr, WIDTH: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_W: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr):
    """The tables of BLOCK_M rows of one (batch, head), both in one launch: the row table from the queries
    (BUILD_ROW), the key table from the keys (BUILD_KEY). A table is per token, so sequences need no offsets: a
    packed stream is one batch of `rows` tokens."""
    block = tl.program_id(0)
    batch = tl.program_id(1) // heads
    head = tl.program_id(1) % heads
    i = block * BLOCK_M + tl.arange(0, BLOCK_M)
    if BUILD_ROW:
        project_rows(Q + batch * sq_b + head * sq_h, FIXED, WQ, A + batch * sa_b + head * sa_h, i, rows, head, sq_s,
                     sa_s, table_scale, HAS_FIXED=HAS_FIXED, WIDTH=WIDTH, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
                     BLOCK_W=BLOCK_W, PRECISION=PRECISION)
    if BUILD_KEY:
        project_rows(K + batch * sk_b + head * sk_h, FIXED, WK, B + batch * sb_b + head * sb_h, i, rows, head, sk_s,
                     sb_s, table_scale, HAS_FIXED=False, WIDTH=WIDTH, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
                     BLOCK_W=BLOCK_W, PRECISION=PRECISION)


@triton.jit
def projected_gradient(grad, DT, W, owner, n, s_s, table_scale, WIDTH: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_W: tl.constexpr, PRECISION: tl.constexpr):
    """grad + dT W^T * table_scale for the rows `owner` of a projected table's gradient dT, whole in memory: the
    share of q (the row table) or k (the key table) that the table's product sends back, added in float32 before
    the gradient's one rounding. The rows' entries were written by this program's own threads, or by an earlier
    launch: the barrier makes this program's writes visible to all its threads first."""
    tl.debug_barrier()
    c = tl.arange(0, BLOCK_W)
    d = tl.arange(0, BLOCK_D)
    dt = tl.load(DT + owner[:, None] * s_s + c[None, :], mask=(owner < n)[:, None] & (c < WIDTH)[None, :], other=0.0)
    w_t = tl.load(W + d[None, :] * WIDTH + c[:, None], mask=(c < WIDTH)[:, None] & (d < HEAD_DIM)[None, :],
                  other=0.0)
    return grad + tl.dot(dt, w_t.to(dt.dtype), input_precision=PRECISION) * table_scale


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
def program_sequence(CU, seqlen, heads, VARLEN: tl.constexpr):
    """(batch, head, first, n) of the (sequence, head) that this program's second grid axis numbers."""
    bh = tl.program_id(1)
    batch = bh // heads
    first, n = sequence(CU, batch, seqlen, VARLEN=VARLEN)
    return batch, bh % heads, first, n


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
def forward_region(acc, m_i, l_i, q, i, i0, row_edge, slope, K, V, A, B, KEEP, first, last, n, key_end, holes,
                   seed, rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, scale, REGION: tl.constexpr,
                   REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr,
                   HAS_ALIBI: tl.constexpr, HAS_KEEP: tl.constexpr, DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """The online softmax (FlashAttention-2) over the key tiles first .. last of one REGION."""
    d = tl.arange(0, BLOCK_D)
    for start in range(first, last, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        operand_mask = (j < n)[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(K + j[:, None] * sk_s + d[None, :], mask=operand_mask, other=0.0)
        key_edge = edge(B, j, n, sb_s, COLUMN=0 if REGION == RIGHT else 2 * REACH,
                        HAS=HAS_KEY and CLIP and REGION != BAND)
        s = score_tile(q, k, A, B, i, j, row_edge, key_edge, slope, n, sa_s, sb_s, scale, REGION=REGION,
                       REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_ALIBI=HAS_ALIBI,
                       PRECISION=PRECISION)
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
def forward_kernel(Q, K, V, A, B, KEEP, CU, SEED, SLOPES, OUT, LSE, p_drop, scale, seqlen, rng_stride, heads,
                   sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, so_b, so_h, so_s,
                   sa_b, sa_h, sa_s, sb_b, sb_h, sb_s, skeep_b, sl_b, sl_h, length_bucket,
                   REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr,
                   HAS_ALIBI: tl.constexpr, HAS_KEEP: tl.constexpr, VARLEN: tl.constexpr, DROPOUT: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """The output of one query block and its rows' log2-sum-exp (LSE), which the backward reads."""
    block = tl.program_id(0)
    batch, head, first, n = program_sequence(CU, seqlen, heads, VARLEN=VARLEN)
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
    seed = dropout_seed(SEED, tl.program_id(1), DROPOUT=DROPOUT)
    slope = alibi_slope(SLOPES, head, HAS_ALIBI=HAS_ALIBI)
    band_first, band_last = band_tiles(i0, n, SIZE=BLOCK_M, OTHER=BLOCK_N, REACH=REACH)
    left = edge(A, i, n, sa_s, COLUMN=0, HAS=HAS_ROW and CLIP)
    right = edge(A, i, n, sa_s, COLUMN=2 * REACH, HAS=HAS_ROW and CLIP)
    acc, m_i, l_i = forward_region(acc, m_i, l_i, q, i, i0, left, slope, K, V, A, B, KEEP, 0,
                                   tl.minimum(band_first, key_end), n, key_end, holes, seed, rng_stride, p_drop,
                                   sk_s, sv_s, sa_s, sb_s, scale, REGION=LEFT, REACH=REACH, CLIP=CLIP,
                                   HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_ALIBI=HAS_ALIBI, HAS_KEEP=HAS_KEEP,
                                   DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
                                   PRECISION=PRECISION)
    acc, m_i, l_i = forward_region(acc, m_i, l_i, q, i, i0, left, slope, K, V, A, B, KEEP, band_first,
                                   tl.minimum(band_last, key_end), n, key_end, holes, seed, rng_stride, p_drop,
                                   sk_s, sv_s, sa_s, sb_s, scale, REGION=BAND, REACH=REACH, CLIP=CLIP,
                                   HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_ALIBI=HAS_ALIBI, HAS_KEEP=HAS_KEEP,
                                   DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
                                   PRECISION=PRECISION)
    acc, m_i, l_i = forward_region(acc, m_i, l_i, q, i, i0, right, slope, K, V, A, B, KEEP, band_last, key_end,
                                   n, key_end, holes, seed, rng_stride, p_drop, sk_s, sv_s, sa_s, sb_s, scale,
                                   REGION=RIGHT, REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY,
                                   HAS_ALIBI=HAS_ALIBI, HAS_KEEP=HAS_KEEP, DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM,
                                   BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, PRECISION=PRECISION)
    out = acc / l_i[:, None]
    if DROPOUT:
        out = out / (1.0 - p_drop)
    tl.store(OUT + i[:, None] * so_s + d[None, :], out.to(OUT.dtype.element_ty), mask=row_mask)
    tl.store(LSE + i, m_i + tl.log2(l_i), mask=i < n)


# ---------------------------------------------------------------------------------------------------------------------
# backward: dS_ij = P_ij (dP_ij - D_i), D_i = dO_i . O_i (Dao et al. 2022, Appendix B.2), in three launches:
# backward_preprocess (D, and the accumulators zeroed), backward_kernel (key-major, five matrix products per tile)
# and query_gradient_kernel (dQ and the row table's edge columns summed over the accumulators, in their order).
#
# backward_kernel deals the key blocks among `splits` programs per (sequence, head). Each holds a key block's dK, dV
# and key-table gradient in registers while every query tile goes by, and adds the tile's share of dQ (dS K) and of
# the row table's edge columns to float32 accumulators. Two designs (ATOMIC, launch.dq_design): a split's own
# accumulators, no atomics, every sum taken in an order fixed by the shapes, so two backward passes are
# bit-identical (as FlashAttention-2's deterministic mode); or one accumulator that a program per key block adds
# into atomically, as the flash backward behind SDPA does (a full grid, one accumulator's memory traffic instead of
# one per split, sums in whatever order the programs reach them). A table's gradient at [i, t] is the sum of dS_ij
# over the keys j whose pair falls in column t: inside the band there is one (stored where the tile finds it),
# beyond it in clip mode's edge columns every other one (summed: the key table's in registers, the row table's in
# the accumulators). A table projected from q or k (tables_kernel) sends its share back to them where its rows of
# the gradient are whole: the key table's at the end of a key block (backward_kernel, FOLD_KEY), the row table's in
# query_gradient_kernel (FOLD_ROW), each a product with the kernel W or U before dQ's and dK's one rounding.


@triton.jit
def accumulate(pointers, values, mask, ATOMIC: tl.constexpr):
    """*pointers += values where mask: atomically in the one shared accumulator (ATOMIC), else in a split's own, which
    no other program reads or writes meanwhile."""
    if ATOMIC:
        tl.atomic_add(pointers, values, mask=mask, sem="relaxed")
    else:
        tl.store(pointers, tl.load(pointers, mask=mask, other=0.0) + values, mask=mask)


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


@triton.jit(do_not_specialize=["seqlen", "splits", "stats_size"])
def backward_preprocess(DO, OUT, DELTA, DQ_ACC, DA_ACC, CU, seqlen, heads, splits, stats_size, sq_b, sq_h, sq_s,
                        sl_b, sl_h, sacc_split, sacc_b, sacc_h, sacc_s, ROW_EDGES: tl.constexpr,
                        VARLEN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_M: tl.constexpr):
    """D_i = dO_i . O_i of one query block's rows, and zeros in those rows of every split's accumulators: dQ's, and
    the row table's edge columns' where ROW_EDGES (a row table in clip mode). DO and OUT are laid out as Q."""
    block = tl.program_id(0)
    batch, head, first, n = program_sequence(CU, seqlen, heads, VARLEN=VARLEN)
    i0 = block * BLOCK_M
    if i0 >= n:
        return
    offset_q = start_of(batch, head, first, sq_b, sq_h, sq_s)
    DO += offset_q
    OUT += offset_q
    stats = batch * sl_b + head * sl_h + first
    DELTA += stats
    DA_ACC += stats
    DQ_ACC += start_of(batch, head, first, sacc_b, sacc_h, sacc_s)
    i = i0 + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    row_mask = (i < n)[:, None] & (d < HEAD_DIM)[None, :]
    do = tl.load(DO + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
    out = tl.load(OUT + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
    tl.store(DELTA + i, tl.sum(do.to(tl.float32) * out.to(tl.float32), 1), mask=i < n)
    for split in range(0, splits):
        tl.store(DQ_ACC + split * sacc_split + i[:, None] * sacc_s + d[None, :],
                 tl.zeros((BLOCK_M, BLOCK_D), tl.float32), mask=row_mask)
        if ROW_EDGES:
            for column in range(0, 2):
                tl.store(DA_ACC + (2 * split + column) * stats_size + i, tl.zeros((BLOCK_M,), tl.float32),
                         mask=i < n)


@triton.jit
def backward_region(dk, dv, db_low, db_high, k, v, j, j0, real, padded, key_edge, slope, Q, DO, LSE, DELTA, A, B, DA,
                    DB, DQ_ACC, DA_ACC, first, last, n, seed, rng_stride, p_drop, stats_size, sq_s, sa_s, sb_s,
                    sda_s, sdb_s, sacc_s, scale, REGION: tl.constexpr, REACH: tl.constexpr, CLIP: tl.constexpr,
                    HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr, HAS_ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr,
                    ATOMIC: tl.constexpr):
    """The query tiles first .. last, for which the key block j lies in REGION, and the five products of each: the
    scores Q K^T, dP = dO V^T, dV += P^T dO, dK += dS^T Q, and dQ's share dS K (into the accumulator)."""
    d = tl.arange(0, BLOCK_D)
    for start in range(first, last, BLOCK_M):
        i = start + tl.arange(0, BLOCK_M)
        rows = i < n
        row_mask = rows[:, None] & (d < HEAD_DIM)[None, :]
        q = tl.load(Q + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
        do = tl.load(DO + i[:, None] * sq_s + d[None, :], mask=row_mask, other=0.0)
        # rows past n get no probability (exp2(s - inf) = 0), whatever their scores
        lse = tl.load(LSE + i, mask=rows, other=float("inf"))
        delta = tl.load(DELTA + i, mask=rows, other=0.0)
        row_edge = edge(A, i, n, sa_s, COLUMN=0 if REGION == LEFT else 2 * REACH,
                        HAS=HAS_ROW and CLIP and REGION != BAND)
        s = score_tile(q, k, A, B, i, j, row_edge, key_edge, slope, n, sa_s, sb_s, scale, REGION=REGION,
                       REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_ALIBI=HAS_ALIBI,
                       PRECISION=PRECISION)
        if padded:  # pads get no probability, so they send nothing to dQ or the row table
            s = tl.where(real[None, :], s, -1.0e30)
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if DROPOUT:
            keep = dropout_keep(seed, start, j0, rng_stride, p_drop, BLOCK_M=BLOCK_M, BLOCK_N=j.shape[0])
            rescale = 1.0 / (1.0 - p_drop)  # a scalar: one division, not one per score
            dp = tl.where(keep, dp * rescale, 0.0)
            p_dropped = tl.where(keep, p * rescale, 0.0)
        else:
            p_dropped = p
        ds = p * (dp - delta[:, None])
        dv += tl.dot(tl.trans(p_dropped.to(do.dtype)), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
        accumulate(DQ_ACC + i[:, None] * sacc_s + d[None, :], tl.dot(ds.to(k.dtype), k, input_precision=PRECISION),
                   row_mask, ATOMIC=ATOMIC)
        if HAS_ROW:
            # query i's column is c(j - i), summed over the keys (axis 1): keys left of the band sit at 0
            if REGION == BAND:
                zeros = tl.zeros((BLOCK_M,), tl.float32)
                low, high = band_table_gradient(DA, ds, i[:, None], j[None, :] - i[:, None],
                                                rows[:, None] & (j < n)[None, :], sda_s, zeros, zeros, AXIS=1,
                                                REACH=REACH, CLIP=CLIP)
                if CLIP:
                    accumulate(DA_ACC + i, low, rows, ATOMIC=ATOMIC)
                    accumulate(DA_ACC + stats_size + i, high, rows, ATOMIC=ATOMIC)
            elif CLIP and REGION == LEFT:
                accumulate(DA_ACC + i, tl.sum(ds, 1), rows, ATOMIC=ATOMIC)
            elif CLIP:
                accumulate(DA_ACC + stats_size + i, tl.sum(ds, 1), rows, ATOMIC=ATOMIC)
        if HAS_KEY:
            # key j's column is c(i - j), summed over the queries (axis 0): keys right of the band sit at 0
            if REGION == BAND:
                # pad keys' entries are zeroed at the end (zero_unpartnered), their edge sums discarded
                db_low, db_high = band_table_gradient(DB, ds, j[None, :], i[:, None] - j[None, :],
                                                      real[None, :] & rows[:, None], sdb_s, db_low, db_high,
                                                      AXIS=0, REACH=REACH, CLIP=CLIP)
            elif CLIP and REGION == RIGHT:
                db_low += tl.sum(ds, 0)
            elif CLIP:
                db_high += tl.sum(ds, 0)
    return dk, dv, db_low, db_high


@triton.jit
def key_block_gradients(j0, Q, K, V, A, B, KEEP, DO, LSE, DELTA, DK, DV, DA, DB, DQ_ACC, DA_ACC, WK, n, key_end,
                        holes, seed, slope, rng_stride, p_drop, scale, table_scale, stats_size, sq_s, sk_s, sv_s, sa_s,
                        sb_s, sda_s, sdb_s, sacc_s, REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr,
                        HAS_KEY: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_KEEP: tl.constexpr, DROPOUT: tl.constexpr,
                        FOLD_KEY: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, PRECISION: tl.constexpr,
                        ATOMIC: tl.constexpr):
    """dK, dV and the key table's gradient of the keys j0 .. j0 + BLOCK_N - 1, and their shares of dQ and of the row
    table's gradient. FOLD_KEY (a key table projected from the keys, k U * table_scale): dK gets the table's share
    too, from the keys' rows of its gradient once they are whole."""
    j = j0 + tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    key_mask = (j < n)[:, None] & (d < HEAD_DIM)[None, :]
    if j0 >= key_end:  # padding only: no probability reaches these keys, and they send nothing to dQ
        zeros = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        tl.store(DK + j[:, None] * sk_s + d[None, :], zeros.to(DK.dtype.element_ty), mask=key_mask)
        tl.store(DV + j[:, None] * sv_s + d[None, :], zeros.to(DV.dtype.element_ty), mask=key_mask)
        if HAS_KEY:
            zero_unpartnered(DB, j, n, n, True, sdb_s, REACH=REACH, CLIP=CLIP)
    else:
        real = real_keys(KEEP, j, key_end, holes, HAS_KEEP=HAS_KEEP)
        padded = j0 + BLOCK_N > key_end  # whether any of these keys is no real one
        if HAS_KEEP:
            padded = padded | holes
        k = tl.load(K + j[:, None] * sk_s + d[None, :], mask=key_mask, other=0.0)
        v = tl.load(V + j[:, None] * sv_s + d[None, :], mask=key_mask, other=0.0)
        dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
        db_low = tl.zeros((BLOCK_N,), tl.float32)
        db_high = tl.zeros((BLOCK_N,), tl.float32)
        # query tiles for which these keys lie wholly right of the band (i < j - r), touch it, lie wholly left
        band_first, band_last = band_tiles(j0, n, SIZE=BLOCK_N, OTHER=BLOCK_M, REACH=REACH)
        # keys right of the band sit at column c(i - j) = 0 of their table row, left of it at 2r
        right = edge(B, j, n, sb_s, COLUMN=0, HAS=HAS_KEY and CLIP)
        left = edge(B, j, n, sb_s, COLUMN=2 * REACH, HAS=HAS_KEY and CLIP)
        dk, dv, db_low, db_high = backward_region(
            dk, dv, db_low, db_high, k, v, j, j0, real, padded, right, slope, Q, DO, LSE, DELTA, A, B, DA, DB, DQ_ACC,
            DA_ACC, 0, band_first, n, seed, rng_stride, p_drop, stats_size, sq_s, sa_s, sb_s, sda_s, sdb_s, sacc_s,
            scale, REGION=RIGHT, REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_ALIBI=HAS_ALIBI,
            DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, PRECISION=PRECISION, ATOMIC=ATOMIC)
        dk, dv, db_low, db_high = backward_region(
            dk, dv, db_low, db_high, k, v, j, j0, real, padded, right, slope, Q, DO, LSE, DELTA, A, B, DA, DB, DQ_ACC,
            DA_ACC, band_first, band_last, n, seed, rng_stride, p_drop, stats_size, sq_s, sa_s, sb_s, sda_s, sdb_s,
            sacc_s, scale, REGION=BAND, REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_ALIBI=HAS_ALIBI,
            DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, PRECISION=PRECISION, ATOMIC=ATOMIC)
        dk, dv, db_low, db_high = backward_region(
            dk, dv, db_low, db_high, k, v, j, j0, real, padded, left, slope, Q, DO, LSE, DELTA, A, B, DA, DB, DQ_ACC,
            DA_ACC, band_last, n, n, seed, rng_stride, p_drop, stats_size, sq_s, sa_s, sb_s, sda_s, sdb_s, sacc_s,
            scale, REGION=LEFT, REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW, HAS_KEY=HAS_KEY, HAS_ALIBI=HAS_ALIBI,
            DROPOUT=DROPOUT, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, PRECISION=PRECISION, ATOMIC=ATOMIC)
        if HAS_KEY:
            # a pad key's band entries are not stored (band_table_gradient's stored_pairs): all its row is zeroed
            zero_unpartnered(DB, j, n, n, ~real, sdb_s, REACH=REACH, CLIP=CLIP)
            if CLIP:
                store_edges(DB, j, n, sdb_s, tl.where(real, db_low, 0.0), tl.where(real, db_high, 0.0), REACH=REACH)
        # pads' columns of P and dS were masked: their dK and dV are zero
        dk *= scale
        if FOLD_KEY:
            dk = projected_gradient(dk, DB, WK, j, n, sdb_s, table_scale, WIDTH=2 * REACH + 1, HEAD_DIM=HEAD_DIM,
                                    BLOCK_D=BLOCK_D, BLOCK_W=BLOCK_W, PRECISION=PRECISION)
        tl.store(DK + j[:, None] * sk_s + d[None, :], dk.to(DK.dtype.element_ty), mask=key_mask)
        tl.store(DV + j[:, None] * sv_s + d[None, :], dv.to(DV.dtype.element_ty), mask=key_mask)


@triton.jit(do_not_specialize=["seqlen", "rng_stride", "splits", "stats_size", "length_bucket"])
def backward_kernel(Q, K, V, A, B, KEEP, CU, SEED, SLOPES, DO, LSE, DELTA, DK, DV, DA, DB, DQ_ACC, DA_ACC, WK, p_drop,
                    scale, table_scale, seqlen, rng_stride, heads, splits, stats_size, sq_b, sq_h, sq_s, sk_b, sk_h,
                    sk_s, sv_b, sv_h, sv_s, sa_b, sa_h, sa_s, sb_b, sb_h, sb_s, skeep_b, sl_b, sl_h, sda_b, sda_h,
                    sda_s, sdb_b, sdb_h, sdb_s, sacc_split, sacc_b, sacc_h, sacc_s, length_bucket, REACH: tl.constexpr,
                    CLIP: tl.constexpr, HAS_ROW: tl.constexpr, HAS_KEY: tl.constexpr, HAS_ALIBI: tl.constexpr,
                    HAS_KEEP: tl.constexpr, VARLEN: tl.constexpr, DROPOUT: tl.constexpr, FOLD_KEY: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_W: tl.constexpr, PRECISION: tl.constexpr, ATOMIC: tl.constexpr):
    """The key blocks split, split + splits, .. of one (sequence, head), one after another (key_block_gradients),
    their dQ shares into split's accumulators, or all into the one accumulator (ATOMIC: `splits` is then at least the
    key blocks, one a program). DO is laid out as Q, DK as K, DV as V."""
    split = tl.program_id(0)
    batch, head, first, n = program_sequence(CU, seqlen, heads, VARLEN=VARLEN)
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
    DA += start_of(batch, head, first, sda_b, sda_h, sda_s)
    DB += start_of(batch, head, first, sdb_b, sdb_h, sdb_s)
    KEEP += batch * skeep_b
    stats = batch * sl_b + head * sl_h + first
    LSE += stats
    DELTA += stats
    accumulator = 0 if ATOMIC else split
    DA_ACC += 2 * accumulator * stats_size + stats
    DQ_ACC += accumulator * sacc_split + start_of(batch, head, first, sacc_b, sacc_h, sacc_s)
    key_end, holes = key_extent(KEEP, n, HAS_KEEP=HAS_KEEP)
    seed = dropout_seed(SEED, tl.program_id(1), DROPOUT=DROPOUT)
    slope = alibi_slope(SLOPES, head, HAS_ALIBI=HAS_ALIBI)
    for j0 in range(split * BLOCK_N, n, splits * BLOCK_N):
        key_block_gradients(j0, Q, K, V, A, B, KEEP, DO, LSE, DELTA, DK, DV, DA, DB, DQ_ACC, DA_ACC, WK, n, key_end,
                            holes, seed, slope, rng_stride, p_drop, scale, table_scale, stats_size, sq_s, sk_s, sv_s,
                            sa_s, sb_s, sda_s, sdb_s, sacc_s, REACH=REACH, CLIP=CLIP, HAS_ROW=HAS_ROW,
                            HAS_KEY=HAS_KEY, HAS_ALIBI=HAS_ALIBI, HAS_KEEP=HAS_KEEP, DROPOUT=DROPOUT,
                            FOLD_KEY=FOLD_KEY, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                            BLOCK_W=BLOCK_W, PRECISION=PRECISION, ATOMIC=ATOMIC)


@triton.jit(do_not_specialize=["seqlen", "splits", "stats_size"])
def query_gradient_kernel(DQ_ACC, DA_ACC, KEEP, CU, DQ, DA, WQ, scale, table_scale, seqlen, heads, splits,
                          stats_size, sacc_split, sacc_b, sacc_h, sacc_s, sl_b, sl_h, skeep_b, sq_b, sq_h, sq_s, sda_b,
                          sda_h, sda_s, REACH: tl.constexpr, CLIP: tl.constexpr, HAS_ROW: tl.constexpr,
                          HAS_KEEP: tl.constexpr, VARLEN: tl.constexpr, FOLD_ROW: tl.constexpr,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_W: tl.constexpr, PRECISION: tl.constexpr):
    """dQ of one query block, its accumulators summed in split order, and the rest of its rows of the row table's
    gradient: zeros where no key is a partner, and in clip mode the edge columns' sums. FOLD_ROW (a row table
    projected from the queries, q W * table_scale + fixed): dQ gets the table's share too, from those rows once they
    are whole. DQ is laid out as Q."""
    block = tl.program_id(0)
    batch, head, first, n = program_sequence(CU, seqlen, heads, VARLEN=VARLEN)
    i0 = block * BLOCK_M
    if i0 >= n:
        return
    DQ += start_of(batch, head, first, sq_b, sq_h, sq_s)
    DQ_ACC += start_of(batch, head, first, sacc_b, sacc_h, sacc_s)
    DA += start_of(batch, head, first, sda_b, sda_h, sda_s)
    DA_ACC += batch * sl_b + head * sl_h + first
    KEEP += batch * skeep_b
    i = i0 + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    row_mask = (i < n)[:, None] & (d < HEAD_DIM)[None, :]
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for split in range(0, splits):
        dq += tl.load(DQ_ACC + split * sacc_split + i[:, None] * sacc_s + d[None, :], mask=row_mask, other=0.0)
    dq *= scale
    if HAS_ROW:
        key_end, _ = key_extent(KEEP, n, HAS_KEEP=HAS_KEEP)
        zero_unpartnered(DA, i, n, key_end, False, sda_s, REACH=REACH, CLIP=CLIP)
        if CLIP:
            low = tl.zeros((BLOCK_M,), tl.float32)
            high = tl.zeros((BLOCK_M,), tl.float32)
            for split in range(0, splits):
                low += tl.load(DA_ACC + 2 * split * stats_size + i, mask=i < n, other=0.0)
                high += tl.load(DA_ACC + (2 * split + 1) * stats_size + i, mask=i < n, other=0.0)
            store_edges(DA, i, n, sda_s, low, high, REACH=REACH)
        if FOLD_ROW:
            dq = projected_gradient(dq, DA, WQ, i, n, sda_s, table_scale, WIDTH=2 * REACH + 1, HEAD_DIM=HEAD_DIM,
                                    BLOCK_D=BLOCK_D, BLOCK_W=BLOCK_W, PRECISION=PRECISION)
    tl.store(DQ + i[:, None] * sq_s + d[None, :], dq.to(DQ.dtype.element_ty), mask=row_mask)
