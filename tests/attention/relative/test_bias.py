"""The relative terms' tables and ALiBi's (attention/relative/bias.py) against explicit loops over positions."""

from __future__ import annotations

import pytest
import torch
from helpers.reference import score_with_relative_terms

from convattn.attention.relative import bias
from convattn.attention.relative.bias import RelativePositionBias, alibi_slopes


def column(offset: int, reach: int) -> int:
    """c(t) = clamp(t, -r, r) + r."""
    return max(-reach, min(reach, offset)) + reach


@pytest.mark.parametrize("n", [1, 2, 7, 12])
def test_alibi_tables_give_minus_slope_times_distance_from_entries_within_half_the_length(n):
    """The decomposition's ALiBi table (`alibi_table`, its row and its key table at once): row[i, c(j - i)] +
    key[j, c(i - j)] = -m_h |i - j| for every pair, on the band and off it (clip mode's edge columns), each entry
    within m_h (n - 1) / 2: positions centred on the sequence's middle keep the float32 entries as small as they
    can be (six heads: slopes that are no powers of two)."""
    heads = 6
    alibi = RelativePositionBias([], num_heads=heads, head_dim=8, reach=8, out_of_window="clip", alibi=True)
    table = alibi.alibi_table(torch.zeros(2, heads, n, 8, dtype=torch.float64))
    assert table.shape == (1, heads, n, 3) and table.dtype == torch.float64
    slopes = torch.tensor(alibi_slopes(heads), dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            pair = table[0, :, i, column(j - i, 1)] + table[0, :, j, column(i - j, 1)]
            torch.testing.assert_close(pair, -slopes * abs(i - j), rtol=0, atol=1e-12)
    assert (table[0].abs() <= slopes[:, None, None] * (n - 1) / 2 + 1e-12).all()


def test_alibi_slopes_are_press_et_al_in_float32_or_wider_whatever_the_operands(monkeypatch):
    """`slopes`, what the fused kernel, FlexAttention and the Toeplitz view read: float32 for half-precision operands
    (float64 for float64), each made once per dtype. Twelve heads (BERT-base's) have slopes 2^-0.5, 2^-1.5, ... that
    bfloat16 would round by up to 1e-4 of themselves, every score off by that times |i - j|."""
    monkeypatch.setattr(bias, "_SLOPES", {})
    alibi = RelativePositionBias([], num_heads=12, head_dim=8, reach=8, out_of_window="clip", alibi=True)
    for dtype, wanted in ((torch.float64, torch.float64), (torch.bfloat16, torch.float32),
                          (torch.float16, torch.float32), (torch.float32, torch.float32)):
        slopes = alibi.slopes(torch.zeros(1, dtype=dtype))
        assert slopes.dtype == wanted, dtype
        torch.testing.assert_close(slopes, torch.tensor(alibi_slopes(12), dtype=torch.float64).to(wanted),
                                   rtol=0, atol=0)


@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
@pytest.mark.parametrize("alibi", [False, True], ids=["terms", "terms+alibi"])
def test_the_bias_of_a_block_of_query_rows_is_their_rows_of_the_whole_bias(alibi, out_of_window):
    """forward(q of rows s .. s + m - 1, every key, first_row=s): each pair's terms, ALiBi's too, for the offsets of
    those rows (the blockwise path's slices), against the loop reference's terms pair by pair, in float64 (batch 2,
    13 keys, reach 3: most pairs outside the window)."""
    torch.manual_seed(0)
    heads, n, d = 3, 13, 8
    rel = RelativePositionBias(["fixed", "dynamic_query", "dynamic_key"], heads, d, 3, out_of_window,
                               alibi=alibi).double()
    with torch.no_grad():
        rel.fixed.normal_()
    q, k = (torch.randn(2, heads, n, d, dtype=torch.float64) for _ in range(2))
    for first, rows in ((0, 13), (5, 4), (11, 2)):
        ours = rel(q[..., first:first + rows, :], k, first_row=first)
        for i in range(first, first + rows):
            for j in range(n):
                expected = score_with_relative_terms(rel, q[..., i, :], k[..., j, :], i, j) \
                    - (q[..., i, :] * k[..., j, :]).sum(-1) / d ** 0.5
                torch.testing.assert_close(ours[..., i - first, j].expand_as(expected), expected, rtol=0, atol=1e-12)
