"""Attention mechanisms behind one interface.

Every mechanism is an `nn.Module` built from a `ConvAttnConfig` (and the layer index) whose
`forward(hidden_states, mask, output_attentions=False)` maps (batch, n, hidden) to the
(batch, n, hidden) context that the layer's output projection consumes, plus the attention
probabilities when asked. `mask` is a `TokenMask`; every branch must honour it.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from convattn.attention.composite import CompositeSelfAttention
from convattn.attention.core import TokenMask, attend

AttentionFactory = Callable[..., nn.Module]
_REGISTRY: dict[str, AttentionFactory] = {}


def register_attention(name: str):
    def wrap(factory: AttentionFactory) -> AttentionFactory:
        _REGISTRY[name] = factory
        return factory

    return wrap


register_attention("self")(lambda config, layer_idx, shared: CompositeSelfAttention(config))


def attention_kind(config, layer_idx: int) -> str:
    """Which registered mechanism a layer uses, read off the config's fields."""
    if config.layer_projections[layer_idx] != "none":
        return "linformer"
    if config.uses_convbert:
        return "convbert"
    return "self"


def build_attention(config, layer_idx: int, shared: nn.ModuleDict) -> nn.Module:
    """`shared` holds modules that several layers use (e.g. Linformer's layerwise projection)."""
    kind = attention_kind(config, layer_idx)
    if kind not in _REGISTRY:
        raise NotImplementedError(f"attention mechanism {kind!r} is not available in this build")
    return _REGISTRY[kind](config, layer_idx, shared)


__all__ = ["TokenMask", "attend", "attention_kind", "build_attention", "register_attention"]
import convattn.attention.convbert  # noqa: E402, F401  (registers "convbert"; needs register_attention)
from convattn.attention import linformer  # noqa: E402, F401  (registers "linformer"; needs register_attention)
