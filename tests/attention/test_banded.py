"""The banded relative-attention path (issue 11): outputs and every gradient against the float64 loop
reference, and the attn_implementation plumbing that selects it."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers.reference import composite_attention_loops
from helpers.relative import TERMS, batch, make_layer, output_and_grads
from helpers.tiny import tiny_config

from convattn import ConvAttnConfig, ConvAttnModel
from convattn.attention import TokenMask, banded, composite, flex
from convattn.attention.banded import banded_relative_attention
from convattn.attention.relative import RelativePositionBias


@pytest.fixture(autouse=True)
def banded_at_any_length(monkeypatch):
    """The banded path starts at BANDED_MIN_LENGTH tokens (a speed choice); test it at every length."""
    monkeypatch.setattr(banded, "BANDED_MIN_LENGTH", 0)


# (n, queries per block, lengths, window chunk bytes): one block holding every key (no fused calls);
# blocks of 2r, the narrowest, and of 8, with a partial last block, fused calls on both sides and whole
# fused parts of pads; windows computed one (batch, head, block) group per chunk
SHAPES = {
    "one block": (13, None, (13, 7, 1), None),
    "blocks of 2r": (37, 6, (37, 20, 1), None),
    "blocks of 8": (29, 8, (29, 11, 2), None),
    "one group per chunk": (29, 8, (29, 11, 2), 1),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
@pytest.mark.parametrize("terms", list(TERMS))
def test_float32_outputs_and_all_gradients_match_loop_reference(terms, out_of_window, shape, monkeypatch):
    # reach 3: most pairs lie outside the band; a short row makes whole parts pad
    n, size, lengths, chunk_bytes = SHAPES[shape]
    if size is not None:
        monkeypatch.setattr(banded, "block_size", lambda n, reach: size)
    if chunk_bytes is not None:
        monkeypatch.setattr(banded, "WINDOW_CHUNK_BYTES", chunk_bytes)
    layer = make_layer(TERMS[terms], out_of_window, value_depthwise_conv=True)
    x, keep = batch(lengths, n, torch.float32)
    ours, our_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x, TokenMask(keep))[0])
    expected, ref_grads = output_and_grads(layer, x, keep, lambda x, keep: composite_attention_loops(layer, x, keep))
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-5, atol=1e-5)
    names = ["input", *(name for name, _ in layer.named_parameters())]
    # 1e-5 of the gradients' scale (entries reach ~25 here, and key.bias's true gradient is 0;
    # the float32 eager path misses a flat 1e-5 too)
    scale = max(want.abs().max().item() for want in ref_grads)
    for name, got, want in zip(names, our_grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("n", [1, 2, 4, 5, 9, 14])
@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
def test_sequences_shorter_than_the_band_match_reference(n, out_of_window, monkeypatch):
    monkeypatch.setattr(banded, "block_size", lambda n, reach: 2 * reach)
    layer = make_layer(TERMS["composite+key"], out_of_window, reach=3, dtype=torch.float64)
    x, keep = batch((n, max(1, n // 2)), n, torch.float64)
    ours, our_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x, TokenMask(keep))[0])
    expected, ref_grads = output_and_grads(layer, x, keep, lambda x, keep: composite_attention_loops(layer, x, keep))
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-9, atol=1e-9)
    for got, want in zip(our_grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
def test_default_blocks_match_the_dense_bias(out_of_window, monkeypatch):
    # the shipped block size over several blocks, a partial last one and whole pad blocks, against the
    # dense-bias path (itself checked against the loop reference), whose cost grows as n^2 only
    n, reach = 601, 8
    assert banded.block_size(n, reach) < n // 2
    layer = make_layer(TERMS["composite+key"], out_of_window, reach=reach, dtype=torch.float64)
    x, keep = batch((n, 260, 3), n, torch.float64)
    ours, our_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x, TokenMask(keep))[0])
    monkeypatch.setattr(banded, "BANDED_MIN_LENGTH", n + 1)
    expected, dense_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x, TokenMask(keep))[0])
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-10, atol=1e-10)
    for got, want in zip(our_grads, dense_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_never_builds_the_dense_bias(monkeypatch):
    layer = make_layer(TERMS["composite+key"])

    def dense_bias(*args, **kwargs):
        raise AssertionError("the n x n bias was built")

    monkeypatch.setattr(RelativePositionBias, "forward", dense_bias)
    x, keep = batch((9, 5), 9, torch.float32)
    layer(x, TokenMask(keep))[0].sum().backward()


def test_dropout_attention_maps_and_short_sequences_keep_the_dense_path(monkeypatch):
    # (from blockwise.BLOCKWISE_MIN_LENGTH tokens on attention dropout runs blockwise: test_blockwise.py)
    calls = []
    original = RelativePositionBias.forward
    monkeypatch.setattr(RelativePositionBias, "forward",
                        lambda self, q, k, first_row=0: calls.append(q.shape[-2]) or original(self, q, k, first_row))
    x, keep = batch((9, 5), 9, torch.float32)
    dropping = make_layer(TERMS["composite"])
    dropping.dropout_p = 0.1
    dropping(x, TokenMask(keep))
    make_layer(TERMS["composite"]).eval()(x, TokenMask(keep), output_attentions=True)
    monkeypatch.setattr(banded, "BANDED_MIN_LENGTH", 10)
    make_layer(TERMS["composite"])(x, TokenMask(keep))
    assert calls == [9, 9, 9]  # each path built the whole (9 x 9) bias once


@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
def test_bfloat16_follows_float32(out_of_window, monkeypatch):
    monkeypatch.setattr(banded, "block_size", lambda n, reach: 8)  # fused calls on both sides of the windows
    torch.manual_seed(0)
    relative = RelativePositionBias(TERMS["composite+key"], 4, 16, 3, out_of_window)
    q, k, v = (torch.randn(2, 4, 37, 16) for _ in range(3))
    keep = torch.arange(37)[None] < torch.tensor([37, 20])[:, None]

    def run(dtype):
        tensors = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = banded_relative_attention(*tensors, **relative.to(dtype).banded(*tensors[:2]), keep=keep, reach=3)
        out.float().pow(2).sum().backward()
        return [out.float(), *(t.grad.float() for t in tensors)]

    for got, want in zip(run(torch.bfloat16), run(torch.float32), strict=True):
        torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)


# ---------------------------------------------------------------- attn_implementation


def test_from_pretrained_attn_implementation_wins(tmp_path):
    ConvAttnModel(tiny_config("chang2021-small/composite")).save_pretrained(tmp_path)
    model = ConvAttnModel.from_pretrained(tmp_path, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    assert model.encoder.layer[0].attention.self.backend == "eager"
    assert ConvAttnModel.from_pretrained(tmp_path).encoder.layer[0].attention.self.backend == "sdpa"


def test_legacy_attention_backend_still_loads(tmp_path):
    ConvAttnModel(tiny_config("chang2021-small/composite")).save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    config_file.write_text(config_file.read_text().replace('"attention_backend": null', '"attention_backend": "eager"'))
    assert ConvAttnModel.from_pretrained(tmp_path).encoder.layer[0].attention.self.backend == "eager"
    explicit = ConvAttnModel.from_pretrained(tmp_path, attn_implementation="sdpa")
    assert explicit.encoder.layer[0].attention.self.backend == "sdpa"


def test_unknown_attn_implementation_is_named():
    with pytest.raises(ValueError, match=r"attn_implementation='flash'.*'sdpa', 'eager'"):
        ConvAttnConfig(attn_implementation="flash")


# ---------------------------------------------------------------- FlexAttention


@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
@pytest.mark.parametrize("terms", list(TERMS))
def test_flex_forward_matches_loop_reference_on_cpu(terms, out_of_window, monkeypatch):
    """torch 2.13 has no CPU backward for flex_attention: the forward only, eagerly, without grad."""
    layer = make_layer(TERMS[terms], out_of_window, hidden_size=64, attn_implementation="flex_attention").eval()
    x, keep = batch((13, 7, 1), 13, torch.float32, width=64)
    calls = []
    monkeypatch.setattr(composite, "flex_relative_attention",
                        lambda *args: calls.append(1) or flex.flex_relative_attention(*args))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention's "eager mode is unoptimised" notice
        ours = layer(x, TokenMask(keep))[0].double()
    assert calls, "the flex path was not taken"
    expected = composite_attention_loops(layer, x.detach(), keep)
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-5, atol=1e-5)


def test_flex_needs_heads_of_16_channels():
    """Its kernel refuses narrower heads; those keep the dense bias instead of failing to compile."""
    q = torch.zeros(1, 4, 5, 8)
    assert not flex.takes_flex_path(q, "flex_attention", 0.0, False)
    assert flex.takes_flex_path(torch.zeros(1, 4, 5, 16), "flex_attention", 0.0, False)
    assert not flex.takes_flex_path(torch.zeros(1, 4, 5, 16), "flex_attention", 0.1, False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's compiled kernel and backward need CUDA")
@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
@pytest.mark.parametrize("terms", list(TERMS))
def test_flex_on_cuda_outputs_and_all_gradients_match_loop_reference(terms, out_of_window):
    """The compiled FlexAttention kernel ("sdpa" on CUDA picks it) with heads of 16, its smallest."""
    layer = make_layer(TERMS[terms], out_of_window, hidden_size=64, value_depthwise_conv=True)
    x, keep = batch((13, 7, 1), 13, torch.float32, width=64)
    expected, ref_grads = output_and_grads(layer, x, keep, lambda x, keep: composite_attention_loops(layer, x, keep))
    layer.cuda()
    ours, our_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x.cuda(), TokenMask(keep.cuda()))[0].cpu())
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-5, atol=1e-5)
    names = ["input", *(name for name, _ in layer.named_parameters())]
    scale = max(want.abs().max().item() for want in ref_grads)
    for name, got, want in zip(names, our_grads, ref_grads, strict=True):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5 * scale,
                                   msg=lambda m, name=name: f"{name}: {m}")
