"""Scaled-down configs of every preset, so structure-level tests run in seconds."""

from __future__ import annotations

import torch

from convattn import ConvAttnConfig
from convattn.presets import preset_fields

TINY = dict(vocab_size=101, embedding_size=16, hidden_size=32, num_attention_heads=4, intermediate_size=64,
            num_hidden_layers=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def tiny_config(preset: str, **overrides) -> ConvAttnConfig:
    fields = dict(TINY)
    if preset_fields(preset).get("linformer_k"):
        # keep the projection meaningful at test lengths: n_max 64, k 16 (conv kernel = stride = 4)
        fields.update(max_position_embeddings=64, linformer_k=16)
    fields.update(overrides)
    return ConvAttnConfig.from_preset(preset, **fields)


def randomize_(module: torch.nn.Module, seed: int = 0) -> None:
    """Give every parameter a random value (zero-initialised tables would hide bugs)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
