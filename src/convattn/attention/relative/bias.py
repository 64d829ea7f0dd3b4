"""Relative positions as lightweight convolutions (Chang et al. 2021, Eqs. 4-6).

Each term adds to the attention score s_ij a value that depends on the offset j - i, read from a
table with 2r + 1 columns (c(t) = clamp(t, -r, r) + r):

* fixed (Raffel et al. 2020, Eq. 4):            beta[head, c(j - i)]               (not scaled)
* dynamic_query (Shaw et al. 2018, Eq. 5):      q_i . W[:, c(j - i)] / sqrt(d)     (W shared by heads)
* dynamic_key (Huang et al. 2020):              k_j . U[:, c(i - j)] / sqrt(d)

Offsets beyond r either reuse the edge column ("clip", as the paper's code) or contribute zero
("zero", a pure (2r + 1)-tap convolution). The per-row tables are O(n x (2r + 1)); `forward` builds
the (n x n) bias (never an n x n x d tensor), `pieces` the O(n x (2r + 1)) pieces that decomposition.py
uses without any n x n tensor, and flex.py and the fused kernel read the tables themselves (`tables`).

ALiBi (Press et al. 2022, in MosaicBERT's symmetric form for encoders) adds -m_h |i - j| to every score, m_h a fixed
slope per head (`alibi_slopes`), no parameter. The dense paths (`forward`, `bias`) add it as it is. The fused kernel
computes it from the positions inside itself, as FlashAttention's ALiBi does, and flex.py's score_mod from the query
and key indices: both take the relative terms' tables without ALiBi (`tables`; none for ALiBi alone) and the slopes
(`slopes`), and no ALiBi tensor of n entries or more exists on those paths. The decomposition (`pieces`) carries it
in the tables (`alibi_table`), in clip mode: with p = position - c (c any constant, the middle of the sequence
keeps the entries small), row[i, t] = sign(t - r) m_h p_i and key[j, s] = sign(s - r) m_h p_j give row[i, c(j - i)]
+ key[j, c(i - j)] = -m_h |i - j| on the band and off it, where clip mode reads the edge columns: left of the band
-m_h p_i + m_h p_j, right of it m_h p_i - m_h p_j. These entries grow with the length (|m_h p| <= m_h n / 2), so
those tables are float32 whatever q's dtype; ALiBi alone gets reach 1 there, the narrowest band that carries it.
With terms that stop at the window ("zero"), the off-band constants are ALiBi's table's edge columns alone.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import Tensor, nn

from convattn.attention.core import is_tracing


def alibi_slopes(heads: int) -> tuple[float, ...]:
    """Press et al.'s slope per head: 2^(-8 k / h), k = 1 .. h, for h a power of two; otherwise those of the power
    of two below h, then every other slope of twice that power (its 1st, 3rd, ...) for the remaining heads (the
    ALiBi paper's code, as MosaicBERT)."""
    def geometric(count: int) -> list[float]:
        return [2.0 ** (-8.0 * k / count) for k in range(1, count + 1)]

    below = 2 ** math.floor(math.log2(heads))
    return tuple(geometric(below) + geometric(2 * below)[0::2][:heads - below])


# ALiBi's slopes as tensors, by (slopes, dtype, device): a tensor built from Python floats on a GPU is a copy that the
# host waits for, which every layer's call would otherwise pay
_SLOPES: dict[tuple[tuple[float, ...], torch.dtype, torch.device], Tensor] = {}


def slopes_tensor(slopes: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """(heads,) `slopes` on `device`, made once: a plain tensor (made outside inference mode, so that a training call
    can save it for its backward) is kept; a traced graph's, or a fake tensor, is made anew."""
    if is_tracing():
        return torch.tensor(slopes, dtype=dtype, device=device)
    key = (slopes, dtype, device)
    if (kept := _SLOPES.get(key)) is not None:
        return kept
    with torch.inference_mode(False):
        made = torch.tensor(slopes, dtype=dtype, device=device)
    if type(made) is torch.Tensor:
        _SLOPES[key] = made
    return made


@lru_cache(maxsize=64)
def relative_columns(n: int, reach: int, clip: bool, device: torch.device) -> Tensor:
    """(n, n) long: the table column for offset j - i at [i, j]; 2r + 1 (a zero column) when cut off."""
    offset = torch.arange(n, device=device)[None, :] - torch.arange(n, device=device)[:, None]
    if clip:
        return offset.clamp(-reach, reach) + reach
    return torch.where(offset.abs() <= reach, offset + reach, torch.full_like(offset, 2 * reach + 1))


class RelativePositionBias(nn.Module):
    """The lightweight-convolution terms of one layer, returned as an additive score bias."""

    def __init__(self, terms: list[str], num_heads: int, head_dim: int, reach: int, out_of_window: str,
                 alibi: bool = False):
        super().__init__()
        if alibi and not terms:
            reach, out_of_window = 1, "clip"  # ALiBi alone: the narrowest band that carries it in tables
        width = 2 * reach + 1
        self.reach, self.clip, self.head_dim = reach, out_of_window == "clip", head_dim
        # plain floats, not a buffer: no parameter, nothing saved, nothing for a meta-device load to lose
        self.alibi = alibi_slopes(num_heads) if alibi else None
        self.fixed = nn.Parameter(torch.zeros(num_heads, width)) if "fixed" in terms else None
        self.query_kernel = nn.Parameter(torch.empty(head_dim, width)) if "dynamic_query" in terms else None
        self.key_kernel = nn.Parameter(torch.empty(head_dim, width)) if "dynamic_key" in terms else None
        self.init_weights()

    @property
    def alibi_alone(self) -> bool:
        """Whether ALiBi is the only term (no fixed or dynamic relative terms beside it)."""
        return self.alibi is not None and self.fixed is None and not self.reads_projections

    @property
    def reads_projections(self) -> bool:
        """Whether a term reads the queries or keys (dynamic_query, dynamic_key), not only the offsets."""
        return self.query_kernel is not None or self.key_kernel is not None

    def init_weights(self, std: float | None = None) -> None:
        # the paper's code: beta starts at zero, W and U use nn.Linear's default (uniform +-1/sqrt(2r+1))
        from transformers import initialization as init

        if self.fixed is not None:
            init.zeros_(self.fixed)
        for kernel in (self.query_kernel, self.key_kernel):
            if kernel is not None:
                init.kaiming_uniform_(kernel, a=math.sqrt(5))

    def _gather(self, table: Tensor, n: int, rows: slice = slice(None), columns: slice = slice(None)) -> Tensor:
        """table (..., m, 2r + 1) -> bias (..., m, m') with bias[..., i, j] = table[..., i, c(j - i)] for rows i
        and columns j of the (n, n) offsets (the table holds the rows' entries)."""
        if not self.clip:
            table = torch.cat([table, table.new_zeros(*table.shape[:-1], 1)], dim=-1)
        # a traced graph has a symbolic n, which the cache cannot hash
        offsets = relative_columns.__wrapped__ if is_tracing() else relative_columns
        index = offsets(n, self.reach, self.clip, table.device)[rows, columns]
        return torch.gather(table, -1, index.expand(*table.shape[:-2], *index.shape))

    def tables(self, q: Tensor, k: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """The row table (..., n, 2r + 1) at [i, c(j - i)] (fixed + dynamic_query) and the key table
        (batch, heads, n, 2r + 1) at [j, c(i - j)] (dynamic_key); None for absent terms. ALiBi not included."""
        return self.row_table(q), self.key_table(k)

    def slopes(self, like: Tensor) -> Tensor | None:
        """(heads,) ALiBi's slopes in float32 (float64 for float64 operands), on like's device; None without ALiBi.
        What the fused kernel and flex.py take beside `tables`."""
        if self.alibi is None:
            return None
        return slopes_tensor(self.alibi, torch.promote_types(like.dtype, torch.float32), like.device)

    def alibi_table(self, like: Tensor) -> Tensor:
        """(1, heads, n, 2r + 1): sign(t - r) m_h (p_i - c), ALiBi as both its row and its key table (module
        docstring), positions p 0 .. n - 1 (n = like.shape[-2]), c their middle."""
        n = like.shape[-2]
        slopes = self.slopes(like)
        signs = torch.arange(-self.reach, self.reach + 1, device=like.device).sign().to(slopes.dtype)
        centred = torch.arange(n, device=like.device).to(slopes.dtype) - (n - 1) / 2
        return (slopes[:, None, None] * centred[None, :, None] * signs)[None]

    def alibi_bias(self, q: Tensor, n: int, rows: slice) -> Tensor:
        """(1, heads, rows, n): -m_h |i - j| for the query `rows` against n keys, in q's dtype."""
        query = torch.arange(n, device=q.device)[rows]
        distance = (query[:, None] - torch.arange(n, device=q.device)[None, :]).abs()
        return (-self.slopes(q)[:, None, None] * distance).to(q.dtype)[None]

    def row_table(self, q: Tensor) -> Tensor | None:
        """(..., m, 2r + 1), the rows of q's queries: fixed + dynamic_query."""
        table = None
        if self.fixed is not None:
            table = self.fixed[None, :, None, :].to(q.dtype).expand(1, -1, q.shape[-2], -1)
        if self.query_kernel is not None:
            dynamic = torch.matmul(q, self.query_kernel.to(q.dtype)) / math.sqrt(self.head_dim)
            table = dynamic if table is None else dynamic + table
        return table

    def key_table(self, k: Tensor) -> Tensor | None:
        """(batch, heads, n, 2r + 1): dynamic_key."""
        if self.key_kernel is None:
            return None
        return torch.matmul(k, self.key_kernel.to(k.dtype)) / math.sqrt(self.head_dim)

    def pieces(self, q: Tensor, k: Tensor) -> dict[str, Tensor | None]:
        """The same bias as `forward` in O(n (2r + 1)) pieces for decomposition.py:
        band (batch, heads, n, 2r + 1), bias of key i + t - r at [i, t]; and, in clip mode or with ALiBi, the
        off-band constants (batch, heads, n) per query row and per key, left and right of the band."""
        batch, heads, n, _ = q.shape
        reach, width = self.reach, 2 * self.reach + 1
        row_table, key_table = self.tables(q, k)
        alibi = None if self.alibi is None else self.alibi_table(q)
        if alibi is not None:  # float32 tables then, whatever q's dtype; the key table as wide as k's batch
            row_table = alibi if row_table is None else row_table.to(alibi.dtype) + alibi
            key_table = alibi.expand(k.shape[0], *alibi.shape[1:]) if key_table is None else \
                key_table.to(alibi.dtype) + alibi
        band = row_table.expand(batch, heads, n, width) if row_table is not None else None
        if key_table is not None:
            # key i + t - r sits at offset i - j = r - t from query i: column 2r - t of its row
            padded = torch.nn.functional.pad(key_table, (0, 0, reach, reach)).flatten(-2)
            index = (torch.arange(n, device=q.device)[:, None] * width
                     + torch.arange(width, device=q.device) * (width - 1) + 2 * reach)
            key_band = padded[..., index]
            band = key_band if band is None else band + key_band
        # key_constants: the per-key constants are ALiBi's alone (no dynamic_key, or off the band in zero mode),
        # which take no gradient (decomposition.py)
        pieces = dict(band=band, row_left=None, row_right=None, key_left=None, key_right=None,
                      key_constants=self.key_kernel is None or not self.clip)
        if not self.clip:
            # off the band the terms add nothing and ALiBi alone continues: its own table's edge columns
            row_table = key_table = alibi
        if row_table is not None:
            pieces["row_left"] = row_table[..., 0].expand(batch, heads, n)
            pieces["row_right"] = row_table[..., 2 * reach].expand(batch, heads, n)
        if key_table is not None:
            key_table = key_table.expand(batch, *key_table.shape[1:])
            pieces["key_left"], pieces["key_right"] = key_table[..., 2 * reach], key_table[..., 0]
        return pieces

    def forward(self, q: Tensor, k: Tensor, first_row: int = 0) -> Tensor:
        """q: (batch, heads, m, d), the queries of rows first_row .. first_row + m - 1; k: (batch, heads, n, d)
        -> bias broadcastable to (batch, heads, m, n)."""
        rows = slice(first_row, first_row + q.shape[-2])
        return self.bias(self.row_table(q), self.key_table(k), k.shape[-2], rows, q)

    def bias(self, row_table: Tensor | None, key_table: Tensor | None, n: int, rows: slice, q: Tensor) -> Tensor:
        """The bias of query `rows` (their queries q) against all n keys from their row table and the whole key table
        (`tables`), and ALiBi's."""
        bias = None if row_table is None else self._gather(row_table, n, rows)
        if key_table is not None:
            # [j, i] of the gathered key table is k_j . U[:, c(i - j)]: transpose to put it at [i, j]
            key_bias = self._gather(key_table, n, slice(None), rows).transpose(-1, -2)
            bias = key_bias if bias is None else bias + key_bias
        if self.alibi is not None:
            alibi = self.alibi_bias(q, n, rows)
            bias = alibi if bias is None else bias + alibi
        return bias


def position_bias(config, num_heads: int, head_dim: int) -> RelativePositionBias | None:
    """The score terms of a layer's self-attention heads: the relative terms and ALiBi's bias, None without either."""
    alibi = config.position_embedding_type == "alibi"
    if not (config.relative_terms or alibi):
        return None
    return RelativePositionBias(config.relative_terms, num_heads, head_dim, config.relative_reach,
                                config.relative_out_of_window, alibi=alibi)
