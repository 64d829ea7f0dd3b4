"""Invalid configs fail at construction, naming the field and the allowed values."""

from __future__ import annotations

import pytest

from convattn import ConvAttnConfig

BAD = [
    (dict(relative_terms=["fixd"]), r"relative_terms contains 'fixd'.*'fixed', 'dynamic_query', 'dynamic_key'"),
    (dict(relative_terms=["fixed", "fixed"]), "relative_terms.*repeats"),
    (dict(relative_out_of_window="wrap"), r"relative_out_of_window='wrap'.*'clip', 'zero'"),
    (dict(position_embedding_type="rotary"), r"position_embedding_type='rotary'.*'absolute', 'none'"),
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
    (dict(sequence_projection="banded"), "sequence_projection='banded'"),
    (dict(sequence_projection=["linear"] * 3, linformer_k=32), "sequence_projection lists 3 layers"),
    (dict(sequence_projection="linear", linformer_k=256), "linformer_k=256 must not exceed"),
    (dict(sequence_projection="linear", linformer_k=32, relative_terms=["fixed"]), "relative_terms cannot be"),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[str(f) for f, _ in BAD])
def test_invalid_config_is_rejected_with_a_clear_message(fields, message):
    with pytest.raises(ValueError, match=message):
        ConvAttnConfig(**fields)


def test_config_round_trips_through_dict():
    config = ConvAttnConfig(relative_terms=["dynamic_query", "fixed"], conv_projections=["value", "query"])
    assert config.relative_terms == ["fixed", "dynamic_query"]  # canonical order
    again = ConvAttnConfig(**config.to_dict())
    assert again.relative_terms == config.relative_terms and again.conv_projections == ["query", "value"]


def test_layouts_expand_per_layer():
    config = ConvAttnConfig(num_hidden_layers=8, max_position_embeddings=512, linformer_k=128,
                            sequence_projection="linear+conv")
    assert config.layer_projections == ["linear"] * 4 + ["conv"] * 4
