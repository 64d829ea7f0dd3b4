"""Invalid configs fail at construction, naming the field and the allowed values."""

from __future__ import annotations

import pytest

from convattn import ConvAttnConfig

BAD = [
    (dict(relative_terms=["fixd"]), r"relative_terms contains 'fixd'.*'fixed', 'dynamic_query', 'dynamic_key'"),
    (dict(relative_terms=["fixed", "fixed"]), "relative_terms.*repeats"),
    (dict(relative_out_of_window="wrap"), r"relative_out_of_window='wrap'.*'clip', 'zero'"),
    (dict(position_embedding_type="rope"), r"position_embedding_type='rope'.*'absolute', 'none', 'rotary', 'alibi'"),
    (dict(rope_theta=500.0), "rope_theta=500.0 has no effect without rotary positions"),
    (dict(position_embedding_type="rotary", rope_theta=0.0), r"rope_theta=0.0 must be a finite number in \(0, inf\)"),
    (dict(position_embedding_type="rotary", rope_theta=float("nan")), "rope_theta=nan must be a finite number"),
    (dict(position_embedding_type="rotary", hidden_size=12, num_attention_heads=4), "heads' size must be even"),
    (dict(position_embedding_type="rotary", hidden_size=36, num_attention_heads=6, head_ratio=3),
     r"heads' size must be even \(got 9\)"),  # ConvBERT's self-attention heads: (H / 2) / (h / 3), not H / h = 6
    (dict(position_embedding_type="rotary", sequence_projection="linear", linformer_k=32),
     "'rotary' cannot be combined with sequence_projection.*no positions to rotate or to bias"),
    (dict(position_embedding_type="alibi", sequence_projection=["conv", "none"], num_hidden_layers=2, linformer_k=32),
     "'alibi' cannot be combined with sequence_projection"),
    (dict(conv_projections=["q"]), r"conv_projections contains 'q'.*'query', 'key', 'value'"),
    (dict(attention_backend="flash"), r"attention_backend='flash'.*'sdpa', 'eager'"),
    (dict(hidden_size=250), "hidden_size=250 must be divisible by num_attention_heads=4"),
    (dict(relative_reach=0), "relative_reach=0 must be an integer >= 1"),
    (dict(conv_projection_kernel=16), "conv_projection_kernel=16 must be odd"),
    (dict(num_attention_heads=2, hidden_size=64, head_ratio=4), "num_attention_heads=2 must be divisible by head_"),
    (dict(num_attention_heads=3, hidden_size=48, conv_projections=["value"]), "must be even"),
    (dict(head_ratio=2, conv_projections=["value"]), "cannot be combined with ConvBERT"),
    (dict(num_groups=3), "must be divisible by num_groups=3"),
    (dict(linformer_k=64), "linformer_k=64 has no effect"),
    (dict(linformer_sharing="layerwise"), "linformer_sharing='layerwise' has no effect"),
    (dict(linformer_conv="depthwise"), "linformer_conv='depthwise' has no effect"),
    (dict(linformer_bias="before_projection"), "linformer_bias='before_projection' has no effect"),
    (dict(sequence_projection="linear", linformer_k=32, linformer_bias="first"), r"linformer_bias='first'.*'after_pro"),
    (dict(head_ratio=2, convbert_kernel_from="value"), r"convbert_kernel_from='value'.*'query', 'key'"),
    (dict(convbert_kernel_from="key"), "convbert_kernel_from='key' has no effect without ConvBERT"),
    (dict(sequence_projection="banded"), "sequence_projection='banded'"),
    (dict(sequence_projection=["linear"] * 3, linformer_k=32), "sequence_projection lists 3 layers"),
    (dict(sequence_projection="linear", linformer_k=256), "linformer_k=256 must not exceed"),
    (dict(sequence_projection="linear", linformer_k=32, relative_terms=["fixed"]), "relative_terms cannot be"),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[str(f) for f, _ in BAD])
def test_invalid_config_is_rejected_with_a_clear_message(fields, message):
    with pytest.raises(ValueError, match=message):
        ConvAttnConfig(**fields)


@pytest.mark.parametrize("fields", [
    dict(position_embedding_type="rotary", rope_theta=160_000.0, relative_terms=["fixed", "dynamic_query"]),
    dict(position_embedding_type="rotary", head_ratio=2), dict(position_embedding_type="rotary",
                                                              conv_projections=["query", "key", "value"]),
    dict(position_embedding_type="alibi", relative_terms=["fixed", "dynamic_query", "dynamic_key"]),
    dict(position_embedding_type="alibi", head_ratio=2),
    dict(position_embedding_type="alibi", value_depthwise_conv=True),
    dict(position_embedding_type="alibi", relative_out_of_window="zero"),  # no terms: nothing is cut off
])
def test_rotary_and_alibi_compose_with_every_mechanism_but_linformer(fields):
    config = ConvAttnConfig(**fields)
    assert config.max_input_length is None  # nothing depends on absolute position
    assert ConvAttnConfig.from_dict(config.to_dict()).to_dict() == config.to_dict()


def test_config_round_trips_through_dict():
    config = ConvAttnConfig(relative_terms=["dynamic_query", "fixed"], conv_projections=["value", "query"])
    assert config.relative_terms == ["fixed", "dynamic_query"]  # canonical order
    again = ConvAttnConfig(**config.to_dict())
    assert again.relative_terms == config.relative_terms and again.conv_projections == ["query", "value"]


@pytest.mark.parametrize(("layers", "expected"), [
    (8, ["linear"] * 4 + ["conv"] * 4), (3, ["linear", "conv", "conv"]), (5, ["linear"] * 2 + ["conv"] * 3),
    (1, ["conv"]),
])
def test_layouts_expand_per_layer_as_malard_splits_them(layers, expected):
    """Malard's Conv-Linformer: linear projections in the first L // 2 layers, convolutions in the rest."""
    config = ConvAttnConfig(num_hidden_layers=layers, max_position_embeddings=512, linformer_k=128,
                            sequence_projection="linear+conv")
    assert config.layer_projections == expected


def saved_dict(**fields) -> dict:
    """config.json as a convattn without `linformer_bias` wrote it."""
    saved = ConvAttnConfig(**fields).to_dict()
    del saved["linformer_bias"]
    return saved


@pytest.mark.parametrize(("layers", "old_split"), [
    (3, ["linear", "linear", "conv"]), (4, ["linear"] * 2 + ["conv"] * 2),
])
def test_configs_saved_before_the_bias_order_keep_their_function(layers, old_split):
    config = ConvAttnConfig.from_dict(saved_dict(num_hidden_layers=layers, max_position_embeddings=64,
                                                 linformer_k=16, sequence_projection="linear+conv"))
    assert config.layer_projections == old_split and config.linformer_bias == "before_projection"
    again = ConvAttnConfig.from_dict(config.to_dict())
    assert again.layer_projections == old_split and again.linformer_bias == "before_projection"


def test_configs_saved_before_the_bias_order_without_linear_layers_are_unchanged():
    plain = ConvAttnConfig.from_dict(saved_dict())
    assert plain.linformer_bias == "after_projection" and plain.layer_projections == ["none"] * 12
    conv = ConvAttnConfig.from_dict(saved_dict(max_position_embeddings=64, linformer_k=16, sequence_projection="conv"))
    assert conv.sequence_projection == "conv" and conv.linformer_bias == "after_projection"


def test_new_configs_get_the_fairseq_bias_order_and_malard_split():
    fields = dict(num_hidden_layers=3, max_position_embeddings=64, linformer_k=16, sequence_projection="linear+conv")
    for config in (ConvAttnConfig(**fields), ConvAttnConfig.from_dict(dict(fields))):
        assert config.linformer_bias == "after_projection"
        assert config.layer_projections == ["linear", "conv", "conv"]
