"""Self-attention with the composite-attention family (Chang et al. 2021).

One module covers every row of the paper: plain or relative-position scores (Eqs. 4-6 and the
key-based term), a fixed depthwise convolution added to the attention output (Eq. 7), and
convolutional queries, keys or values in half the heads (Section 5).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from convattn.attention.core import PackedSequences, TokenMask, attn_implementation
from convattn.attention.depthwise import depthwise_over_tokens
from convattn.attention.relative import attention_per_sequence, position_bias
from convattn.attention.rotary import rotated_for_attention, turned_projections


class DepthwiseConv1d(nn.Conv1d):
    """Conv1d(channels, channels, kernel, groups=channels), 'same' zero padding, with bias, kept at
    PyTorch's default init (the paper's code never re-initialised its convolutions)."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__(channels, channels, kernel_size, groups=channels, padding=kernel_size // 2, bias=True)

    def init_weights(self, std: float) -> None:
        from transformers import initialization as init

        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(self.weight[0].numel())
        init.uniform_(self.bias, -bound, bound)


class ConvProjection(nn.Module):
    """Depthwise-separable convolution in the first half of the output, linear in the second:
    concat(pointwise(depthwise(x)), linear(x)). The conv half comes first, so heads 0..h/2-1 are
    the convolutional ones for Q, K and V alike. The convolution runs along each sequence of `mask`; without
    one, x is a batch of sequences whose pad rows are already zeroed."""

    def __init__(self, hidden_size: int, kernel_size: int):
        super().__init__()
        self.depthwise = DepthwiseConv1d(hidden_size, kernel_size)
        self.pointwise = nn.Linear(hidden_size, hidden_size // 2)
        self.linear = nn.Linear(hidden_size, hidden_size // 2)

    def forward(self, x: Tensor, mask: TokenMask | PackedSequences | None = None) -> Tensor:
        convolved = self.convolve(x) if mask is None else mask.convolve(self.convolve, x)
        return torch.cat([self.pointwise(convolved), self.linear(x)], dim=-1)

    def convolve(self, x: Tensor) -> Tensor:
        return depthwise_over_tokens(self.depthwise, x)


class CompositeSelfAttention(nn.Module):
    """softmax(QK^T/sqrt(d) + relative terms [+ ALiBi] + mask) V [+ DWConv(V)] for all heads, Q and K rotated with
    rotary positions."""

    def __init__(self, config):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.dropout_p = config.attention_probs_dropout_prob
        self.config = config
        self.conv_projection_input = bool(config.conv_projections)

        def projection(name: str) -> nn.Module:
            if name in config.conv_projections:
                return ConvProjection(hidden, config.conv_projection_kernel)
            return nn.Linear(hidden, hidden)

        self.query, self.key, self.value = projection("query"), projection("key"), projection("value")
        self.relative = position_bias(config, self.num_heads, config.head_dim)
        self.rope_theta = config.rope_theta if config.position_embedding_type == "rotary" else None
        self.value_conv = DepthwiseConv1d(hidden, config.relative_kernel_size) if config.value_depthwise_conv else None

    def forward(self, hidden_states: Tensor, mask: TokenMask | PackedSequences, output_attentions: bool = False):
        """hidden_states: a padded batch (batch, n, H) with its TokenMask, or packed sequences (1, total, H)."""
        if self.conv_projection_input:
            # as the paper's code: with convolutional projections, pad rows are zeroed for all of Q, K, V
            hidden_states = mask.zero_pads(hidden_states)
        turned = turned_projections(hidden_states, self.query, self.key, mask.token_positions(), self.num_heads,
                                    self.rope_theta, self.relative)
        if turned is not None:  # rotary, and only the scores read q and k: projected in pair order, turned
            (query, key), values, tables_from = turned, self.value(hidden_states), None
        else:
            query, key, values = (layer(hidden_states, mask) if isinstance(layer, ConvProjection)
                                  else layer(hidden_states) for layer in (self.query, self.key, self.value))
            query, key, tables_from = rotated_for_attention(query, key, mask.token_positions(), self.num_heads,
                                                            self.rope_theta, self.relative,
                                                            self.config.rotary_relative_terms)
        dropout_p = self.dropout_p if self.training else 0.0
        context, probs = attention_per_sequence(
            query, key, values, self.num_heads, self.relative, mask, dropout_p=dropout_p,
            attn_implementation=attn_implementation(self.config), need_weights=output_attentions,
            tables_from=tables_from)
        if self.value_conv is not None:
            # Eq. 7: a depthwise convolution of the values, added after softmax, dropout and x V
            context = context + mask.convolve(lambda v: depthwise_over_tokens(self.value_conv, v), values)
        return context, probs
