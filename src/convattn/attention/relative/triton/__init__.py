"""Attention with relative terms in one fused Triton kernel, forward and backward (attn_implementation
TRITON_IMPLEMENTATION; the CUDA default). Its public entry is attention/relative/triton_attention.py.

The score of query i and key j (Chang et al. 2021, Eqs. 4-6; bias.py) is

    s_ij = q_i . k_j * scale + A[i, c(j - i)] + B[j, c(i - j)],    c(t) = clamp(t, -r, r) + r,

with A = fixed + q W / sqrt(d) (the row table) and B = k U / sqrt(d) (the key table), both (.., n, 2r + 1). A layer
sends the terms' parameters, not the tables: both are projected from q and k in one launch of their own
(tables_kernel), and the backward kernels add each table's share of the gradient, dA W^T / sqrt(d) and
dB U^T / sqrt(d), to dq and dk themselves, so that torch computes only the parameters' gradients (three reductions)
around the kernels. Tables may also be given as they are (rotary's unrotated terms, fixed terms alone). In "zero"
mode the terms vanish where |j - i| > r. The kernel is FlashAttention-2
(Dao 2023) with the tables read inside it: a tile of (query, key) pairs wholly left of the band (j < i - r)
adds only A[i, 0] + B[j, 2r], one wholly right (j > i + r) only A[i, 2r] + B[j, 0], and a tile that touches
the band gathers its columns. The loops over key tiles run in those three regions (LEFT, BAND, RIGHT), so the
gather is paid on about (BLOCK_M + 2r) / BLOCK_N tiles per query block. ALiBi's -m_h |i - j| (bias.py) is no
table: given the heads' slopes, the kernels add it to every score of every tile, computed from the positions
within the sequence, as FlashAttention's ALiBi is.

Dropout draws its mask from Philox (`tl.randint4x`, seven rounds: sixteen bytes a call, a byte per score, the
sixteen scores of a call chosen so that the numbers land where the scores are; dropout_keep) keyed by (seed +
batch * heads + head, a counter of the query pair and the key's chunk of 32); the backward draws the same numbers.
p is rounded to a multiple of 1/256 (kernel_dropout_p), query tiles are multiples of 16 queries, key tiles of 32
keys.
The backward is one key-major pass of five matrix products per tile (S = Q K^T, dP = dO V^T, dV += P^T dO,
dK += dS^T Q, dQ += dS K), with dS_ij = P_ij (dP_ij - D_i), D_i = dO_i . O_i (Dao et al. 2022, Appendix B.2): each
key block's dK, dV and key-table gradient stay in registers while the query tiles go by, and dQ is summed across key
blocks without atomics, in float32 accumulators of each split of the key blocks, added up in a fixed order
afterwards (as FlashAttention-2's deterministic mode): two backward passes give the same bits. A table's gradient at
[i, t] is the sum of dS_ij over the keys j whose pair falls in column t: one partner inside the band (stored, never
summed), every one beyond it in clip mode's edge columns (summed in a fixed order), each entry written once.

Operands are either padded, (batch, heads, n, d) with an optional key mask `keep` (batch, n), or packed
variable-length sequences, (total, heads, d) with `cu_seqlens` (batch + 1,) as in flash-attn's varlen API. Keys
past a sequence's last real one are skipped, and the mask is read tile by tile only where pads come before it
(key_extent), so right padding costs nothing per tile.
On CPU the kernels run only under Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported):
that is how the tests check them.

The modules, read in this order: kernels.py, the device code alone; launch.py, the tilings and launches;
operator.py, the operators torch.compile sees and the public entry.
"""
