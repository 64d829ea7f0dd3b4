"""Composite-attention family against the float64 loop reference."""

from __future__ import annotations

import pytest
import torch
from helpers.reference import composite_attention_loops
from helpers.tiny import randomize_

from convattn import ConvAttnConfig
from convattn.attention import TokenMask
from convattn.attention.composite import CompositeSelfAttention
from convattn.attention.relative import relative_columns

TERMS = {
    "none": [],
    "fixed": ["fixed"],
    "dynamic": ["dynamic_query"],
    "key": ["dynamic_key"],
    "composite": ["fixed", "dynamic_query"],
    "composite+key": ["fixed", "dynamic_query", "dynamic_key"],
}


def make_attention(attn_implementation="sdpa", **fields) -> CompositeSelfAttention:
    config = ConvAttnConfig(hidden_size=32, num_attention_heads=4, attn_implementation=attn_implementation, **fields)
    module = CompositeSelfAttention(config).double().eval()
    randomize_(module)
    return module


def padded_batch(lengths, n, hidden=32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), n, hidden, generator=generator, dtype=torch.float64)
    keep = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return x, keep


def assert_matches_reference(module, lengths=(13, 7, 1), n=13):
    x, keep = padded_batch(lengths, n)
    ours, _ = module(x, TokenMask(keep))
    expected = composite_attention_loops(module, x, keep)
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
@pytest.mark.parametrize("terms", list(TERMS))
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_relative_terms_match_loop_reference(terms, out_of_window, attn_implementation):
    # reach 3 with n = 13 puts most pairs outside the window, so clip and zero really differ
    module = make_attention(attn_implementation, relative_terms=TERMS[terms], relative_reach=3,
                            relative_out_of_window=out_of_window)
    assert_matches_reference(module)


@pytest.mark.parametrize("terms", ["none", "composite"])
def test_value_depthwise_conv_matches_loop_reference(terms):
    module = make_attention(relative_terms=TERMS[terms], value_depthwise_conv=True, relative_reach=4)
    assert module.value_conv.kernel_size == (9,)
    assert_matches_reference(module)


@pytest.mark.parametrize("projections", [["value"], ["query", "key"], ["query", "key", "value"]])
@pytest.mark.parametrize("terms", ["none", "composite"])
def test_conv_projections_match_loop_reference(projections, terms):
    module = make_attention(relative_terms=TERMS[terms], conv_projections=projections, conv_projection_kernel=5)
    assert_matches_reference(module)


def test_conv_projection_half_comes_first():
    """Heads 0..h/2-1 are the convolutional ones: changing a neighbour changes only them."""
    module = make_attention(conv_projections=["query", "key", "value"])
    x, _ = padded_batch([9], 9)
    y = x.clone()
    y[:, 5] += 1.0
    q_x, q_y = module.query(x), module.query(y)
    changed = (q_x - q_y).abs()[0, 4]  # position 4 sees position 5 only through the conv half
    assert changed[:16].abs().max() > 0
    assert changed[16:].abs().max() == 0


def test_spec_default_reach_and_tables():
    config = ConvAttnConfig(relative_terms=["fixed", "dynamic_query", "dynamic_key"])
    module = CompositeSelfAttention(config)
    assert module.relative.fixed.shape == (4, 17)
    assert module.relative.query_kernel.shape == (64, 17)
    assert module.relative.key_kernel.shape == (64, 17)
    assert torch.all(module.relative.fixed == 0)
    bound = 1 / 17**0.5
    assert module.relative.query_kernel.abs().max() <= bound


def test_relative_columns_clip_and_zero():
    clip = relative_columns(6, 2, True, torch.device("cpu"))
    zero = relative_columns(6, 2, False, torch.device("cpu"))
    for i in range(6):
        for j in range(6):
            assert clip[i, j] == max(-2, min(2, j - i)) + 2
            assert zero[i, j] == (j - i + 2 if abs(j - i) <= 2 else 5)


def test_attention_probabilities_ignore_pads():
    module = make_attention("eager", relative_terms=TERMS["composite"])
    x, keep = padded_batch([5, 3], 6)
    _, probs = module(x, TokenMask(keep), output_attentions=True)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 6, dtype=torch.float64))
    assert probs[1, :, :, 3:].abs().max() == 0


def test_sdpa_and_eager_agree_with_dropout_off_in_float32():
    torch.manual_seed(0)
    config = ConvAttnConfig(hidden_size=32, num_attention_heads=4, relative_terms=["fixed", "dynamic_query"],
                            value_depthwise_conv=True)
    sdpa = CompositeSelfAttention(config).eval()
    randomize_(sdpa)
    eager = CompositeSelfAttention(ConvAttnConfig(**{**config.to_dict(), "attn_implementation": "eager"})).eval()
    eager.load_state_dict(sdpa.state_dict())
    x, keep = padded_batch([11, 4], 11)
    x = x.float()
    torch.testing.assert_close(sdpa(x, TokenMask(keep))[0], eager(x, TokenMask(keep))[0], rtol=1e-5, atol=1e-5)
