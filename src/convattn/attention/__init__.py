"""Attention mechanisms behind one interface.

Every mechanism is an `nn.Module` built from a `ConvAttnConfig` (and the layer index) whose
`forward(hidden_states, mask, output_attentions=False)` maps (batch, n, hidden) to the
(batch, n, hidden) context that the layer's output projection consumes, plus the attention
probabilities when asked. `mask` is a `TokenMask`; every branch must honour it. Mechanisms that take packed
sequences (all but Linformer) also accept a stream (1, total, hidden) with its `PackedSequences`, and compute
each sequence as if it were alone.

Which class a layer uses is read off the config (`attention_kind`) and looked up in `ATTENTION_CLASSES`,
as transformers picks a model's attention class: one explicit table, no registration. Linformer's layers
are built apart, with their index and the projections they may share.
"""

from __future__ import annotations

from torch import nn

from convattn.attention.composite import CompositeSelfAttention
from convattn.attention.convbert import ConvBertMixedAttention
from convattn.attention.core import PackedSequences, TokenMask, attend
from convattn.attention.linformer import LinformerSelfAttention

ATTENTION_CLASSES: dict[str, type[nn.Module]] = {
    "self": CompositeSelfAttention,  # absolute, relative, composite, conv projections (Chang et al. 2021)
    "convbert": ConvBertMixedAttention,  # span-based dynamic convolution heads (Jiang et al. 2020)
}


def attention_kind(config, layer_idx: int) -> str:
    """"self", "convbert" (the `ATTENTION_CLASSES` keys) or "linformer" (sequence-projected keys and values, Wang
    et al. 2020; Conv-Linformer), read off the config's fields."""
    if config.layer_projections[layer_idx] != "none":
        return "linformer"
    if config.uses_convbert:
        return "convbert"
    return "self"


def build_attention(config, layer_idx: int, shared: nn.ModuleDict) -> nn.Module:
    """`shared` holds modules that several layers use (Linformer's layerwise projection)."""
    kind = attention_kind(config, layer_idx)
    if kind == "linformer":
        return LinformerSelfAttention(config, layer_idx, shared)
    return ATTENTION_CLASSES[kind](config)


__all__ = ["ATTENTION_CLASSES", "PackedSequences", "TokenMask", "attend", "attention_kind", "build_attention"]
