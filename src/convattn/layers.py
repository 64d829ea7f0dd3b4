"""The encoder's layers: embeddings, the post-LN layer (attention, then the feed-forward block, each with add & norm)
and their stack. The attention modules themselves are convattn.attention's, one per mechanism.

Weight names follow HuggingFace BERT/ConvBERT (`embeddings.*`, `encoder.layer.{i}.attention.self.*`,
`attention.output.{dense,LayerNorm}`, `intermediate.dense`, `output.{dense,LayerNorm}`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput

from convattn.attention import PackedSequences, TokenMask, build_attention
from convattn.config import ConvAttnConfig


class ConvAttnEmbeddings(nn.Module):
    """word + token type [+ absolute position] -> LayerNorm -> dropout, all of embedding_size."""

    def __init__(self, config: ConvAttnConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.position_embeddings = (
            nn.Embedding(config.max_position_embeddings, config.embedding_size)
            if config.position_embedding_type == "absolute" else None
        )
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.embedding_size)
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None) -> Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        batch, n = inputs_embeds.shape[:2]
        if token_type_ids is None:
            token_type_ids = torch.zeros(batch, n, dtype=torch.long, device=inputs_embeds.device)
        embeddings = inputs_embeds + self.token_type_embeddings(token_type_ids)
        if self.position_embeddings is not None:
            if position_ids is None:
                position_ids = torch.arange(n, device=inputs_embeds.device)[None, :]
            embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


class GroupedLinear(nn.Module):
    """ConvBERT's grouped linear layer: contiguous channel groups, weight (G, in/G, out/G), one bias."""

    def __init__(self, in_features: int, out_features: int, num_groups: int):
        super().__init__()
        self.num_groups = num_groups
        self.weight = nn.Parameter(torch.empty(num_groups, in_features // num_groups, out_features // num_groups))
        self.bias = nn.Parameter(torch.empty(out_features))

    def init_weights(self, std: float) -> None:
        init.normal_(self.weight, mean=0.0, std=std)
        init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        grouped = x.unflatten(-1, (self.num_groups, -1))
        out = torch.einsum("...gi,gio->...go", grouped, self.weight)
        return out.flatten(-2) + self.bias


def feed_forward_linear(in_features: int, out_features: int, num_groups: int) -> nn.Module:
    if num_groups == 1:
        return nn.Linear(in_features, out_features)
    return GroupedLinear(in_features, out_features, num_groups)


class ConvAttnSelfOutput(nn.Module):
    """dense -> dropout -> LayerNorm(x + residual)."""

    def __init__(self, config: ConvAttnConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class ConvAttnAttention(nn.Module):
    def __init__(self, config: ConvAttnConfig, layer_idx: int, shared: nn.ModuleDict):
        super().__init__()
        self.self = build_attention(config, layer_idx, shared)
        self.output = ConvAttnSelfOutput(config)

    def forward(self, hidden_states: Tensor, mask: TokenMask | PackedSequences, output_attentions: bool = False):
        context, probs = self.self(hidden_states, mask, output_attentions)
        return self.output(context, hidden_states), probs


class ConvAttnIntermediate(nn.Module):
    def __init__(self, config: ConvAttnConfig):
        super().__init__()
        self.dense = feed_forward_linear(config.hidden_size, config.intermediate_size, config.num_groups)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.act(self.dense(hidden_states))


class ConvAttnOutput(nn.Module):
    def __init__(self, config: ConvAttnConfig):
        super().__init__()
        self.dense = feed_forward_linear(config.intermediate_size, config.hidden_size, config.num_groups)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class ConvAttnLayer(GradientCheckpointingLayer):
    """Post-LN BERT layer: attention -> add & norm -> FFN -> add & norm."""

    def __init__(self, config: ConvAttnConfig, layer_idx: int, shared: nn.ModuleDict):
        super().__init__()
        self.attention = ConvAttnAttention(config, layer_idx, shared)
        self.intermediate = ConvAttnIntermediate(config)
        self.output = ConvAttnOutput(config)

    def forward(self, hidden_states: Tensor, mask: TokenMask | PackedSequences, output_attentions: bool = False):
        attention_output, probs = self.attention(hidden_states, mask, output_attentions)
        return self.output(self.intermediate(attention_output), attention_output), probs


class ConvAttnEncoder(nn.Module):
    def __init__(self, config: ConvAttnConfig):
        super().__init__()
        # modules used by several layers (Linformer's layerwise projection); empty otherwise
        self.shared = nn.ModuleDict()
        self.layer = nn.ModuleList(ConvAttnLayer(config, i, self.shared) for i in range(config.num_hidden_layers))
        self.gradient_checkpointing = False

    def forward(self, hidden_states: Tensor, mask: TokenMask | PackedSequences, output_attentions=False,
                output_hidden_states=False):
        all_hidden = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layer:
            hidden_states, probs = layer(hidden_states, mask, output_attentions)
            if output_hidden_states:
                all_hidden += (hidden_states,)
            if output_attentions:
                all_attentions += (probs,)
        return BaseModelOutput(last_hidden_state=hidden_states, hidden_states=all_hidden, attentions=all_attentions)
