"""Linformer and Conv-Linformer against a float64 reference with explicit E/F
matrices and an explicit strided sum, plus padding, lengths, sharing, presets and save/load."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from helpers.reference import linear
from helpers.tiny import randomize_
from torch import nn
from transformers import AutoModelForMaskedLM

from convattn import ConvAttnConfig, ConvAttnForMaskedLM, ConvAttnModel
from convattn.attention import TokenMask
from convattn.attention.composite import CompositeSelfAttention
from convattn.attention.linformer import LinearSequenceProjection, LinformerSelfAttention
from convattn.presets import preset_fields, preset_names

SHARING = ["headwise", "key_value", "layerwise"]
SMALL = dict(vocab_size=101, embedding_size=16, hidden_size=32, num_attention_heads=4, intermediate_size=64,
             num_hidden_layers=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
PAPER_PRESETS = ["malard/transformer-n128", "malard/linformer-n128-k32", "malard/conv-linformer-n128-k32"]


def small_config(preset: str, **overrides) -> ConvAttnConfig:
    """A paper preset scaled down: hidden 32, 4 layers (2 linear + 2 conv), n_max 64, k 16 (conv stride 4)."""
    fields = dict(SMALL, max_position_embeddings=64)
    if preset_fields(preset).get("linformer_k"):
        fields["linformer_k"] = 16
    return ConvAttnConfig.from_preset(preset, **{**fields, **overrides})


def small_model(preset: str, cls=ConvAttnModel, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = cls(small_config(preset, **overrides))
    randomize_(model, seed)
    return model.eval()


def attention_module(kind: str, sharing: str = "headwise", conv: str = "dense", attn_implementation: str = "sdpa",
                     n_max: int = 24, k: int = 6, bias: str = "after_projection") -> LinformerSelfAttention:
    config = ConvAttnConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, max_position_embeddings=n_max,
                            linformer_k=k, sequence_projection=kind, linformer_sharing=sharing, linformer_conv=conv,
                            linformer_bias=bias, attn_implementation=attn_implementation)
    shared = nn.ModuleDict()  # the encoder owns it (and converts it) in a real model
    module = LinformerSelfAttention(config, 0, shared).double().eval()
    shared.double()
    randomize_(module)
    randomize_(shared, seed=1)
    return module


# ---------------------------------------------------------------------------- float64 reference
def project_reference(x: torch.Tensor, projection: nn.Module, n_max: int) -> torch.Tensor:
    """(batch, n, C) -> (batch, k, C) by the definition: zero-pad to n_max, then either the
    explicit k x n_max matrix E, or out[j] = sum_t W[:, :, t] x[j * s + t] with stride s = n_max // k."""
    batch, n, channels = x.shape
    x = torch.cat([x.double(), torch.zeros(batch, n_max - n, channels, dtype=torch.float64)], dim=1)
    if isinstance(projection, LinearSequenceProjection):
        return projection.weight.double() @ x
    weight = projection.weight.double()  # (C_out, C_in / groups, s)
    stride, k = weight.shape[-1], n_max // weight.shape[-1]
    depthwise = projection.groups == channels
    out = torch.zeros(batch, k, channels, dtype=torch.float64)
    for j in range(k):
        for t in range(stride):
            row = x[:, j * stride + t, :]
            out[:, j, :] += weight[:, 0, t] * row if depthwise else row @ weight[:, :, t].T
    return out


def projected_reference(x, real, layer: nn.Linear, projection: nn.Module, bias: str, n_max: int):
    """Linear sequence projection with bias "after_projection" (fairseq): W (E x) + b, E over the real rows
    of x; otherwise (conv, or "before_projection"): E (W x + b) over the real rows of W x + b."""
    if isinstance(projection, LinearSequenceProjection) and bias == "after_projection":
        return linear(project_reference(x * real, projection, n_max), layer)
    return project_reference(linear(x, layer) * real, projection, n_max)


def linformer_reference(module: LinformerSelfAttention, x: torch.Tensor, keep: torch.Tensor, n_max: int):
    """softmax(Q (P_K K)^T / sqrt(d)) (P_V V), pad rows never projected, one head at a time."""
    x = x.double()
    batch, n, hidden = x.shape
    heads = module.num_heads
    d = hidden // heads
    real = keep[..., None].double()
    q = linear(x, module.query)
    key_projection, value_projection = module.projections
    bias = module.config.linformer_bias
    keys = projected_reference(x, real, module.key, key_projection, bias, n_max)
    values = projected_reference(x, real, module.value, value_projection, bias, n_max)
    out = torch.zeros(batch, n, hidden, dtype=torch.float64)
    for h in range(heads):
        cols = slice(h * d, (h + 1) * d)
        probs = torch.softmax(q[..., cols] @ keys[..., cols].transpose(1, 2) / math.sqrt(d), dim=-1)
        out[..., cols] = probs @ values[..., cols]
    return out


def padded_batch(lengths, n, hidden=32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), n, hidden, generator=generator, dtype=torch.float64)
    keep = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return x, keep


def assert_matches_reference(module, lengths, n, n_max):
    x, keep = padded_batch(lengths, n)
    ours, _ = module(x, TokenMask(keep))
    expected = linformer_reference(module, x, keep, n_max)
    torch.testing.assert_close(ours[keep], expected[keep], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bias", ["after_projection", "before_projection"])
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("sharing", SHARING)
def test_linear_projection_matches_explicit_matrices(sharing, attn_implementation, bias):
    module = attention_module("linear", sharing, attn_implementation=attn_implementation, bias=bias)
    key_projection, value_projection = module.projections
    assert (key_projection is value_projection) == (sharing != "headwise")
    assert_matches_reference(module, lengths=(24, 17, 1), n=24, n_max=24)  # full length
    assert_matches_reference(module, lengths=(13, 7, 2), n=13, n_max=24)  # shorter: the first 13 columns of E


@pytest.mark.parametrize("conv", ["dense", "depthwise"])
@pytest.mark.parametrize("sharing", SHARING)
def test_conv_projection_matches_explicit_strided_sum(sharing, conv):
    module = attention_module("conv", sharing, conv)
    conv_layer = module.projections[0]
    assert conv_layer.kernel_size == conv_layer.stride == (4,) and conv_layer.bias is None
    assert conv_layer.weight.shape == ((32, 1, 4) if conv == "depthwise" else (32, 32, 4))
    assert_matches_reference(module, lengths=(24, 17, 1), n=24, n_max=24)
    # 13 tokens: the last window is partly zero padding, two windows see only padding
    assert_matches_reference(module, lengths=(13, 7, 2), n=13, n_max=24)


def test_fairseq_order_adds_each_bias_once_to_each_projected_key():
    """The bias orders differ by exactly the bias term: fairseq's adds b once, the other E_real 1 b^T."""
    after, before = attention_module("linear"), attention_module("linear", bias="before_projection")
    before.load_state_dict(after.state_dict())
    x, keep = padded_batch((13, 6, 1), 13)
    mask = TokenMask(keep)
    keys_after, values_after = after.projected_keys_values(x, mask)
    keys_before, values_before = before.projected_keys_values(x, mask)

    def real_row_sums(projection):  # (batch, k, 1): E's row sums over each sequence's real tokens
        return (projection.weight[:, :13].double() @ keep.double().T).T[..., None]

    torch.testing.assert_close(keys_before - keys_after, (real_row_sums(after.key_projection) - 1) * after.key.bias,
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(values_before - values_after,
                               (real_row_sums(after.value_projection) - 1) * after.value.bias, rtol=1e-12, atol=1e-12)


def test_attention_probabilities_are_over_the_k_projected_positions():
    module = attention_module("linear", attn_implementation="eager")
    x, keep = padded_batch((10, 4), 10)
    context, probs = module(x, TokenMask(keep), output_attentions=True)
    assert probs.shape == (2, 4, 10, 6)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 10, dtype=torch.float64))
    torch.testing.assert_close(context, module(x, TokenMask(keep))[0])


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_sdpa_serves_unless_the_maps_are_asked_for(attn_implementation, monkeypatch):
    """"sdpa": one SDPA call on the k projected keys and values, no map returned; asked for the maps, or "eager",
    the scores are computed explicitly (no SDPA call) and the (batch, heads, n, k) probabilities come back."""
    module = attention_module("linear", attn_implementation=attn_implementation)
    x, keep = padded_batch((10, 4), 10)
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, v, **kwargs: calls.append((tuple(q.shape), tuple(k.shape), tuple(v.shape)))
                        or sdpa(q, k, v, **kwargs))
    context, probs = module(x, TokenMask(keep))
    if attn_implementation == "sdpa":
        assert calls == [((2, 4, 10, 8), (2, 4, 6, 8), (2, 4, 6, 8))] and probs is None
    else:
        assert not calls and probs.shape == (2, 4, 10, 6)
    calls.clear()
    mapped, probs = module(x, TokenMask(keep), output_attentions=True)
    assert not calls and probs.shape == (2, 4, 10, 6)
    torch.testing.assert_close(mapped, context, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", ["after_projection", "before_projection"])
@pytest.mark.parametrize("sharing", SHARING)
def test_a_projection_shared_by_keys_and_values_projects_the_input_once(sharing, bias):
    """With the bias after the projection, keys and values are maps of one projected input: a projection shared by
    both (key_value, layerwise) runs once; headwise (two projections), or the maps first, project twice."""
    module = attention_module("linear", sharing, bias=bias)
    calls = []
    for projection in set(module.projections):
        projection.register_forward_hook(lambda *args: calls.append(1))
    x, keep = padded_batch((10, 4), 10)
    module(x, TokenMask(keep))
    assert len(calls) == (1 if sharing != "headwise" and bias == "after_projection" else 2)


# ---------------------------------------------------------------------------- the encoder
def assert_padding_invariant(model, lengths=(19, 8, 1), extra=10, seed=1):
    generator = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.randint(5, 101, (len(lengths), n), generator=generator)
    keep = (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]).long()
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=keep).last_hidden_state
        # other ids at the pads, and `extra` more pad positions
        noisy = torch.where(keep.bool(), ids, torch.randint(0, 101, ids.shape, generator=generator))
        longer = torch.cat([noisy, torch.randint(0, 101, (len(lengths), extra), generator=generator)], dim=1)
        longer_keep = torch.cat([keep, torch.zeros(len(lengths), extra, dtype=torch.long)], dim=1)
        padded_more = model(input_ids=longer, attention_mask=longer_keep).last_hidden_state
        for b, length in enumerate(lengths):
            alone = model(input_ids=ids[b : b + 1, :length]).last_hidden_state[0]
            torch.testing.assert_close(batched[b, :length], alone, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(padded_more[b, :length], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", PAPER_PRESETS)
def test_paper_presets_do_not_depend_on_padding(preset):
    assert_padding_invariant(small_model(preset))


@pytest.mark.parametrize(("sharing", "conv", "positions"), [
    ("key_value", "dense", "absolute"), ("headwise", "depthwise", "none"), ("key_value", "depthwise", "absolute"),
])
def test_conv_linformer_options_do_not_depend_on_padding(sharing, conv, positions):
    model = small_model("malard/conv-linformer-n128-k32", linformer_sharing=sharing, linformer_conv=conv,
                        position_embedding_type=positions)
    assert_padding_invariant(model)


@pytest.mark.parametrize("projection", ["linear", "conv"])
def test_layerwise_sharing_does_not_depend_on_padding(projection):
    model = small_model("malard/linformer-n128-k32", sequence_projection=projection, linformer_sharing="layerwise")
    assert_padding_invariant(model, lengths=(64 - 10, 33, 5))  # up to n_max with the extra pads


@pytest.mark.parametrize("preset", PAPER_PRESETS[1:])
def test_every_length_up_to_max_works_and_longer_is_rejected(preset):
    model = small_model(preset, max_position_embeddings=24, linformer_k=6)
    with torch.no_grad():
        for n in range(1, 25):
            out = model(input_ids=torch.randint(5, 101, (2, n))).last_hidden_state
            assert out.shape == (2, n, 32) and torch.isfinite(out).all()
        with pytest.raises(ValueError, match="sequence length 25 exceeds max_position_embeddings=24"):
            model(input_ids=torch.randint(5, 101, (1, 25)))
    # the attention module on its own rejects over-long input too (no silent shape bug)
    attention = model.encoder.layer[-1].attention.self
    with pytest.raises(ValueError, match="sequence length 25 exceeds max_position_embeddings=24"):
        attention(torch.randn(1, 25, 32), TokenMask(torch.ones(1, 25, dtype=torch.bool)))


def test_transformer_baseline_is_full_attention():
    """Every position sees every other (the author's baseline was block-local by a reshape bug)."""
    model = small_model("malard/transformer-n128")
    assert all(isinstance(layer.attention.self, CompositeSelfAttention) for layer in model.encoder.layer)
    ids = torch.randint(5, 101, (1, 64))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1 - 5) % 96 + 5
    with torch.no_grad():
        first = model(input_ids=ids).last_hidden_state[0, 0]
        first_changed = model(input_ids=changed).last_hidden_state[0, 0]
    assert not torch.allclose(first, first_changed)


@pytest.mark.parametrize(("projection", "sharing", "conv"), [
    ("linear+conv", "headwise", "dense"), ("linear+conv", "key_value", "depthwise"),
    ("linear", "layerwise", "dense"), ("conv", "layerwise", "depthwise"),
])
def test_every_parameter_gets_a_gradient(projection, sharing, conv):
    torch.manual_seed(0)
    config = small_config("malard/conv-linformer-n128-k32", sequence_projection=projection,
                          linformer_sharing=sharing, linformer_conv=conv, hidden_dropout_prob=0.1,
                          attention_probs_dropout_prob=0.1)
    model = ConvAttnForMaskedLM(config).train()
    ids = torch.randint(5, 101, (3, 21))
    keep = torch.ones_like(ids)
    keep[1, 15:] = 0
    labels = torch.where(torch.rand(ids.shape) < 0.3, ids, torch.full_like(ids, -100))
    labels[:, 0] = ids[:, 0]
    model(input_ids=ids, attention_mask=keep, labels=labels).loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing
    projections = [name for name, _ in model.named_parameters() if "projection" in name]
    assert projections and all(model.get_parameter(name).grad.abs().sum() > 0 for name in projections)


# ---------------------------------------------------------------------------- sharing and save/load
def projection_parameters(model) -> dict[str, tuple]:
    return {name: tuple(p.shape) for name, p in model.named_parameters() if "projection" in name}


@pytest.mark.parametrize("sharing", SHARING)
def test_sharing_modes_own_their_parameters_once(sharing):
    model = small_model("malard/linformer-n128-k32", linformer_sharing=sharing)
    params = projection_parameters(model)
    layers = model.encoder.layer
    if sharing == "headwise":
        key_projection, value_projection = layers[0].attention.self.projections
        assert len(params) == 8 and key_projection is not value_projection
    elif sharing == "key_value":
        assert len(params) == 4 and all("key_value_projection" in name for name in params)
    else:
        assert params == {"encoder.shared.linformer_projection.weight": (16, 64)}
        shared = model.encoder.shared["linformer_projection"]
        assert all(p is shared for layer in layers for p in layer.attention.self.projections)
    assert set(params) <= set(model.state_dict())
    assert sum("projection" in key for key in model.state_dict()) == len(params)


@pytest.mark.parametrize(("preset", "sharing"), [
    ("malard/linformer-n128-k32", "layerwise"), ("malard/conv-linformer-n128-k32", "headwise"),
    ("malard/conv-linformer-n128-k32", "key_value"),
])
def test_save_and_load_round_trip(tmp_path, preset, sharing):
    model = small_model(preset, cls=ConvAttnForMaskedLM, linformer_sharing=sharing)
    model.save_pretrained(tmp_path)
    loaded, info = AutoModelForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    loaded.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert loaded.config.linformer_sharing == sharing
    if sharing == "layerwise":
        shared = loaded.convattn.encoder.shared["linformer_projection"]
        assert all(p is shared for layer in loaded.convattn.encoder.layer for p in layer.attention.self.projections)
    ids = torch.randint(5, 101, (2, 30))
    keep = torch.ones_like(ids)
    keep[1, 20:] = 0
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids, attention_mask=keep).logits,
                                   model(input_ids=ids, attention_mask=keep).logits)


def test_models_saved_before_the_bias_order_load_with_their_old_function(tmp_path):
    """A 3-layer Conv-Linformer saved with the old layer split (linear, linear, conv) and the biases projected
    with the keys: its config.json has no linformer_bias and says "linear+conv"; it loads computing the same."""
    old = small_model("malard/conv-linformer-n128-k32", cls=ConvAttnForMaskedLM, num_hidden_layers=3,
                      sequence_projection=["linear", "linear", "conv"], linformer_bias="before_projection")
    old.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["linformer_bias"]
    saved["sequence_projection"] = "linear+conv"
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded, info = AutoModelForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert loaded.config.layer_projections == ["linear", "linear", "conv"]
    ids = torch.randint(5, 101, (2, 31))
    keep = torch.ones_like(ids)
    keep[1, 17:] = 0
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(input_ids=ids, attention_mask=keep).logits,
                                   old(input_ids=ids, attention_mask=keep).logits)


def test_projections_are_initialised_normal_002():
    torch.manual_seed(0)
    model = ConvAttnModel(small_config("malard/conv-linformer-n128-k32", max_position_embeddings=1024,
                                       linformer_k=64, num_hidden_layers=2))
    linear_e = model.encoder.layer[0].attention.self.key_projection.weight
    conv_w = model.encoder.layer[1].attention.self.value_projection.weight
    for weight in (linear_e, conv_w):
        assert abs(weight.mean().item()) < 2e-3 and abs(weight.std().item() - 0.02) < 1e-3


# ---------------------------------------------------------------------------- presets and config
def test_preset_grid_has_every_n_k_pair_with_k_below_n():
    names = {name for name in preset_names() if name.startswith("malard/")}
    ns, ks = (128, 256, 512, 1024), (32, 64, 128, 256)
    expected = {f"malard/transformer-n{n}" for n in ns}
    for n in ns:
        for k in ks:
            if k < n:
                expected |= {f"malard/linformer-n{n}-k{k}", f"malard/conv-linformer-n{n}-k{k}"}
    assert names == expected and len(names) == 4 + 13 + 13
    conv = ConvAttnConfig.from_preset("malard/conv-linformer-n1024-k64")
    assert (conv.num_hidden_layers, conv.hidden_size, conv.num_attention_heads, conv.intermediate_size) == (8, 512, 8,
                                                                                                            2048)
    assert conv.max_position_embeddings == 1024 and conv.linformer_k == 64
    assert conv.layer_projections == ["linear"] * 4 + ["conv"] * 4 and conv.linformer_conv == "dense"
    assert ConvAttnConfig.from_preset("malard/linformer-n256-k32").layer_projections == ["linear"] * 8
    assert ConvAttnConfig.from_preset("malard/transformer-n512").layer_projections == ["none"] * 8


def test_overriding_n_and_k_re_derives_every_projection_shape():
    with torch.device("meta"):
        model = ConvAttnModel(ConvAttnConfig.from_preset("malard/conv-linformer-n512-k128",
                                                         max_position_embeddings=8192))
        linformer = ConvAttnModel(ConvAttnConfig.from_preset("malard/linformer-n512-k128", max_position_embeddings=8192,
                                                             linformer_k=256))
    assert model.embeddings.position_embeddings.weight.shape == (8192, 512)
    layers = [layer.attention.self for layer in model.encoder.layer]
    assert all(layer.key_projection.weight.shape == (128, 8192) for layer in layers[:4])
    assert all(layer.value_projection.weight.shape == (512, 512, 64) for layer in layers[4:])
    assert all(layer.attention.self.value_projection.weight.shape == (256, 8192) for layer in linformer.encoder.layer)


def test_length_not_divisible_by_k_is_rejected_for_conv_only():
    with pytest.raises(ValueError, match="max_position_embeddings=1000 must be divisible by linformer_k=128"):
        ConvAttnConfig.from_preset("malard/conv-linformer-n512-k128", max_position_embeddings=1000)
    # E/F are (k, n) matrices: any n works
    assert ConvAttnConfig.from_preset("malard/linformer-n512-k128", max_position_embeddings=1000).linformer_k == 128


@pytest.mark.parametrize(("fields", "message"), [
    (dict(linformer_k=0), "needs linformer_k >= 1"),
    (dict(linformer_k=1024), "linformer_k=1024 must not exceed max_position_embeddings=512"),
    (dict(relative_terms=["fixed"]), "relative_terms cannot be combined"),
    (dict(value_depthwise_conv=True), "value_depthwise_conv cannot be combined"),
    (dict(conv_projections=["value"]), "conv_projections cannot be combined"),
    (dict(head_ratio=2), "head_ratio cannot be combined"),
    (dict(linformer_sharing="layerwise"), "layerwise.*same sequence_projection"),
    (dict(linformer_sharing="per_head"), "linformer_sharing='per_head'"),
    (dict(linformer_conv="grouped"), "linformer_conv='grouped'"),
])
def test_combinations_that_make_no_sense_are_rejected(fields, message):
    with pytest.raises(ValueError, match=message):
        ConvAttnConfig.from_preset("malard/conv-linformer-n512-k128", **fields)
