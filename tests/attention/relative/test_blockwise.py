"""The blockwise path for relative terms with attention dropout on CPU: exact against the float64 loop
reference without dropout, the same dropout masks in backward as in forward, and never the whole n x n bias."""

from __future__ import annotations

import pytest
import torch
from helpers.reference import composite_attention_loops
from helpers.relative import TERMS, batch, make_layer, output_and_grads

from convattn.attention import TokenMask
from convattn.attention.core import split_heads
from convattn.attention.relative import RelativePositionBias, blockwise, dispatch
from convattn.attention.relative.blockwise import _attend_rows, blockwise_relative_attention


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 4 query rows (a partial last one at n = 13), from any length on."""
    monkeypatch.setattr(blockwise, "block_size", lambda n, reach, tiling: 4)
    monkeypatch.setattr(dispatch, "CPU_BLOCKWISE_MIN_LENGTH", 0)


@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
@pytest.mark.parametrize("terms", list(TERMS))
def test_without_dropout_matches_loop_reference(terms, out_of_window, monkeypatch):
    monkeypatch.setattr(dispatch, "relative_path", lambda *args: "blockwise")
    layer = make_layer(TERMS[terms], out_of_window)
    x, keep = batch((13, 7, 1), 13, torch.float32)
    ours, our_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x, TokenMask(keep))[0])
    expected, ref_grads = output_and_grads(layer, x, keep, lambda x, keep: composite_attention_loops(layer, x, keep))
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-5, atol=1e-5)
    for got, want in zip(our_grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * max(want.abs().max().item(), 1.0))


def test_backward_replays_the_forward_dropout_masks():
    # the checkpointed blocks against the same blocks kept whole for autograd, from the same seed
    torch.manual_seed(0)
    relative = RelativePositionBias(TERMS["composite+key"], 2, 8, 3, "clip")
    q, k, v = (torch.randn(2, 2, 13, 8, requires_grad=True) for _ in range(3))
    keep = torch.arange(13)[None] < torch.tensor([13, 6])[:, None]
    mask = TokenMask(keep)

    def run(blocks):
        torch.manual_seed(1)
        out = blocks()
        grads = torch.autograd.grad(out.pow(2).sum(), [q, k, v, *relative.parameters()])
        return [out, *grads]

    def kept_whole():
        key_table = relative.key_table(k)
        return torch.cat([_attend_rows(q[..., s:s + 4, :], k, v, q[..., s:s + 4, :], key_table, relative, s, mask,
                                       0.4) for s in range(0, 13, 4)], dim=-2)

    ours = run(lambda: blockwise_relative_attention(q, k, v, relative, mask, 0.4))
    for got, want in zip(ours, run(kept_whole), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.equal(ours[0], run(lambda: blockwise_relative_attention(q, k, v, relative, mask, 0.0))[0])


def test_dropout_takes_it_and_never_builds_the_whole_bias(monkeypatch):
    layer = make_layer(TERMS["composite"])
    layer.dropout_p = 0.1
    rows = []
    original = RelativePositionBias.bias
    monkeypatch.setattr(RelativePositionBias, "bias", lambda self, row_table, key_table, n, query_rows, q:
                        rows.append(query_rows.stop - query_rows.start) or original(self, row_table, key_table, n,
                                                                                   query_rows, q))
    x, keep = batch((13, 7), 13, torch.float32)
    layer(x, TokenMask(keep))[0].sum().backward()
    assert rows and max(rows) == 4  # forward and the backward's recompute, block by block
    q = split_heads(layer.query(x), 4)
    assert dispatch.relative_path(q, "sdpa", 0.1, False) == "blockwise"
    assert dispatch.relative_path(q, "sdpa", 0.1, True) == "dense"  # attention maps
    assert dispatch.relative_path(q, "eager", 0.1, False) == "dense"
