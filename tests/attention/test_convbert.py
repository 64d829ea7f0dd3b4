"""ConvBERT mixed attention against a float64 loop reference, padding behaviour, presets."""

from __future__ import annotations

import pytest
import torch
from helpers.reference import mixed_attention_loops
from helpers.tiny import randomize_
from transformers import ConvBertConfig
from transformers.models.convbert.modeling_convbert import ConvBertSelfAttention

from convattn import ConvAttnConfig, ConvAttnForMaskedLM, ConvAttnModel
from convattn.attention import TokenMask
from convattn.attention.convbert import ConvBertMixedAttention

HIDDEN = 32


def make_attention(**fields) -> ConvBertMixedAttention:
    fields = {"hidden_size": HIDDEN, "num_attention_heads": 4, "head_ratio": 2, "conv_kernel_size": 5, **fields}
    module = ConvBertMixedAttention(ConvAttnConfig(**fields)).double().eval()
    randomize_(module)
    return module


def padded_batch(lengths, n, seed=0):
    """Random inputs (garbage in the pad rows too) and the keep mask."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), n, HIDDEN, generator=generator, dtype=torch.float64)
    keep = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return x, keep


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("padding", ["masked", "reference"])
def test_matches_loop_reference(padding, attn_implementation):
    module = make_attention(convbert_padding=padding, attn_implementation=attn_implementation)
    x, keep = padded_batch([11, 6, 2, 1], 11)
    ours, _ = module(x, TokenMask(keep))
    assert ours.shape == (4, 11, HIDDEN)
    expected = mixed_attention_loops(module, x, keep, masked=padding == "masked")
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("padding", ["masked", "reference"])
def test_chang_key_token_kernels_match_loop_reference(padding, attn_implementation):
    module = make_attention(convbert_kernel_from="key", convbert_padding=padding,
                            attn_implementation=attn_implementation)
    assert module.key_conv_attn_layer.depthwise.bias.abs().min() > 0  # randomised, so the bias is tested
    x, keep = padded_batch([11, 6, 2, 1], 11)
    ours, _ = module(x, TokenMask(keep))
    expected = mixed_attention_loops(module, x, keep, masked=padding == "masked", kernel_from="key")
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-10, atol=1e-10)


def test_chang_kernels_weigh_only_real_keys_in_the_window():
    module = make_attention(convbert_kernel_from="key")
    x, keep = padded_batch([7, 3], 7)
    query = module.query(x)
    kernel = module.conv_kernels(x, query, TokenMask(keep))  # (batch, n, N, K)
    torch.testing.assert_close(kernel.sum(-1), torch.ones(2, 7, 2, dtype=torch.float64))
    for b, length in enumerate((7, 3)):
        for i in range(length):
            for t in range(5):
                if not 0 <= i + t - 2 < length:
                    assert (kernel[b, i, :, t] == 0).all()


@pytest.mark.parametrize("kernel_from", ["query", "key"])
def test_attention_dropout_reaches_the_conv_heads_only_in_chang_variant(kernel_from):
    module = make_attention(convbert_kernel_from=kernel_from, attention_probs_dropout_prob=0.5).train()
    x, keep = padded_batch([9, 5], 9)
    conv_halves = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        conv_halves.append(module(x, TokenMask(keep))[0][..., HIDDEN // 2:])
    assert torch.equal(*conv_halves) == (kernel_from == "query")


@pytest.mark.parametrize("terms", [["fixed"], ["dynamic_query"], ["fixed", "dynamic_query", "dynamic_key"]])
def test_relative_terms_apply_to_the_self_attention_heads(terms):
    module = make_attention(relative_terms=terms, relative_reach=3)
    assert module.relative is not None
    if module.relative.fixed is not None:
        assert module.relative.fixed.shape == (2, 7)  # N = 4 // 2 self-attention heads
    x, keep = padded_batch([9, 4], 9)
    ours, _ = module(x, TokenMask(keep))
    real = keep[..., None].expand_as(ours)
    expected = mixed_attention_loops(module, x, keep, masked=True)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-10, atol=1e-10)
    # the conv half is the same as without relative terms
    plain = make_attention()
    plain.load_state_dict({k: v for k, v in module.state_dict().items() if not k.startswith("relative.")})
    torch.testing.assert_close(ours[..., HIDDEN // 2:], plain(x, TokenMask(keep))[0][..., HIDDEN // 2:])


@pytest.mark.parametrize("kernel_from", ["query", "key"])
@pytest.mark.parametrize("kernel_size", [3, 9])
def test_masked_outputs_at_real_positions_do_not_depend_on_padding(kernel_size, kernel_from):
    module = make_attention(conv_kernel_size=kernel_size, convbert_kernel_from=kernel_from)
    lengths = [13, 7, 4, 1]  # odd lengths, and lengths below the kernel size
    x, keep = padded_batch(lengths, 13)
    batched, _ = module(x, TokenMask(keep))
    garbage, _ = module(torch.where(keep[..., None], x, 100 * torch.randn_like(x)), TokenMask(keep))
    for b, length in enumerate(lengths):
        alone, _ = module(x[b : b + 1, :length], TokenMask(torch.ones(1, length, dtype=torch.bool)))
        torch.testing.assert_close(batched[b, :length], alone[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(garbage[b, :length], alone[0], rtol=1e-10, atol=1e-10)


def test_reference_padding_leaks_into_the_last_half_kernel_of_real_tokens():
    module = make_attention(convbert_padding="reference", conv_kernel_size=5)
    x, keep = padded_batch([12, 7], 12)
    padded, _ = module(x, TokenMask(keep))
    alone, _ = module(x[1:, :7], TokenMask(torch.ones(1, 7, dtype=torch.bool)))
    changed = (padded[1, :7] - alone[0]).abs().amax(dim=-1) > 1e-9
    assert changed.tolist() == [False] * 5 + [True] * 2  # K // 2 = 2 tokens see the pads
    # only the conv heads leak; the self-attention half masks its scores
    torch.testing.assert_close(padded[1, :7, : HIDDEN // 2], alone[0, :, : HIDDEN // 2])


def test_reference_padding_is_exactly_transformers_computation():
    module = make_attention(convbert_padding="reference", conv_kernel_size=9).float()
    hf = ConvBertSelfAttention(ConvBertConfig(hidden_size=HIDDEN, num_attention_heads=4, head_ratio=2,
                                              conv_kernel_size=9, attention_probs_dropout_prob=0.0)).eval()
    hf.load_state_dict({k: v for k, v in module.state_dict().items()}, strict=True)
    x, keep = padded_batch([10, 6, 3], 10)
    x = x.float()
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)[:, None, None, :]
    with torch.no_grad():
        expected, _ = hf(x, additive)
        ours, _ = module(x, TokenMask(keep))
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)  # pad rows included


def test_every_parameter_gets_a_gradient():
    module = make_attention(relative_terms=["fixed", "dynamic_query", "dynamic_key"]).train()
    x, keep = padded_batch([9, 5], 9)
    ours, _ = module(x, TokenMask(keep))
    ours[keep].square().sum().backward()
    missing = [name for name, p in module.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing


def test_attention_maps_cover_the_self_attention_heads_only():
    module = make_attention(attn_implementation="eager")
    x, keep = padded_batch([8, 5], 8)
    _, probs = module(x, TokenMask(keep), output_attentions=True)
    assert probs.shape == (2, 2, 8, 8)
    assert probs[1, :, :, 5:].abs().max() == 0


def test_fewer_self_attention_heads_split_half_the_width():
    module = make_attention(num_attention_heads=4, head_ratio=4)  # one head of each kind, of size H / 2
    assert (module.num_heads, module.head_size) == (1, HIDDEN // 2)
    x, keep = padded_batch([7, 3], 7)
    ours, _ = module(x, TokenMask(keep))
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], mixed_attention_loops(module, x, keep, True)[real], rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="hidden_size=9 must be divisible by 2"):
        ConvBertMixedAttention(ConvAttnConfig(hidden_size=9, num_attention_heads=3, head_ratio=3))


def test_layers_use_mixed_attention_and_reference_init():
    model = ConvAttnModel(ConvAttnConfig.from_preset("convbert/small", num_hidden_layers=2, vocab_size=50))
    attention = model.encoder.layer[1].attention.self
    assert isinstance(attention, ConvBertMixedAttention)
    separable = attention.key_conv_attn_layer
    assert separable.depthwise.weight.shape == (256, 1, 9) and separable.pointwise.weight.shape == (128, 256, 1)
    assert separable.bias.shape == (128, 1) and not separable.bias.any()
    assert abs(separable.depthwise.weight.std().item() - 0.02) < 0.003
    assert attention.conv_kernel_layer.weight.shape == (2 * 9, 128)


# ConvBERT paper sizes: encoder-only counts (ConvAttnModel), and Chang et al.'s row with the MLM head (their code's
# count: a depthwise key-convolution bias of 256 in each of the 12 layers more than Jiang et al.'s)
@pytest.mark.parametrize(("name", "cls", "expected"), [
    ("convbert/small", ConvAttnModel, 13_143_768),
    ("convbert/medium-small", ConvAttnModel, 17_475_888),
    ("convbert/base", ConvAttnModel, 105_680_520),
    ("chang2021-small/convbert", ConvAttnForMaskedLM, 13_094_540),
])
def test_preset_parameter_counts_match_spec(name, cls, expected):
    with torch.device("meta"):
        assert cls(ConvAttnConfig.from_preset(name)).num_parameters() == expected
