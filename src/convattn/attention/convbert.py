"""ConvBERT's mixed attention (Jiang et al. 2020).

The h configured heads are split in two: N = h // head_ratio self-attention heads and N span-based
dynamic-convolution heads, each working on a bottleneck of width A = H / 2 (heads of size A / N; for
head_ratio 2 that is d = H / h). For token i and conv head g:

    Ks      = pointwise(depthwise_K(X)) + bias                  (separable conv, H -> A)
    kernel  = softmax_t(conv_kernel_layer(Ks * Q)[i, g, t])     (K taps per head, no scaling)
    out[i]  = sum_t kernel[i, g, t] * V'[i + t - K//2]           (V' = conv_out_layer(X), zero outside)

and the layer's output is concat(self-attention heads, conv heads) -> dense -> add & norm.

Chang et al. 2021 (`convbert_kernel_from="key"`, their code's "convbert" attention) run a variant: the
weight of query i's tap on key j = i + t - K//2 is the logit predicted at the KEY token,
conv_kernel_layer(Ks * Q)[j, g, t]; taps outside the sequence or on padding are left out of the softmax
over the K taps, attention dropout applies to these probabilities, and the depthwise key convolution
has a bias.

Padding: with convbert_padding="masked" pad rows are zeroed in the input of the separable
convolution and in the conv value V', so a real token sees exactly the zeros it would see at the end
of an unpadded sequence and its output does not depend on padding. "reference" skips the zeroing,
as the reference codes do (they only mask the self-attention scores), for checkpoint parity.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import initialization as init

from convattn.attention.core import PackedSequences, TokenMask, attn_implementation
from convattn.attention.depthwise import depthwise_over_tokens
from convattn.attention.relative import attention_per_sequence, position_bias
from convattn.attention.rotary import rotated_for_attention


def shifted_taps(x: Tensor, kernel_size: int) -> list[Tensor]:
    """The K views x[:, i + t - K//2] (zeros outside the sequence) of a (batch, n, ...) tensor.

    Views into one zero-padded copy: summing weighted taps costs K multiply-adds per element,
    without the K-times-larger copy that unfold + matmul makes.
    """
    n, half = x.shape[1], kernel_size // 2
    padded = F.pad(x, (0, 0) * (x.dim() - 2) + (half, half))
    return [padded[:, t : t + n] for t in range(kernel_size)]


def dynamic_conv(value: Tensor, kernel: Tensor) -> Tensor:
    """out[b, i, g] = sum_t kernel[b, i, g, t] * value[b, i + t - K//2, g].

    value: (batch, n, heads, head_size); kernel: (batch, n, heads, K) -> (batch, n, heads, head_size).
    """
    taps = shifted_taps(value, kernel.shape[-1])
    out = kernel[..., 0, None] * taps[0]
    for t in range(1, len(taps)):
        out = out + kernel[..., t, None] * taps[t]
    return out


class SeparableConv1D(nn.Module):
    """Depthwise Conv1d(H, H, K, groups=H) then pointwise Conv1d(H, A, 1), both without bias, then + bias (A, 1).

    Parameter names and shapes are those of the reference (HF `key_conv_attn_layer`); `depthwise_bias` adds
    the depthwise convolution's bias (H) that Chang et al.'s code has.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, depthwise_bias: bool = False):
        super().__init__()
        self.depthwise = nn.Conv1d(in_channels, in_channels, kernel_size, groups=in_channels,
                                   padding=kernel_size // 2, bias=depthwise_bias)
        self.pointwise = nn.Conv1d(in_channels, out_channels, 1, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels, 1))

    def init_weights(self, std: float) -> None:
        init.normal_(self.depthwise.weight, mean=0.0, std=std)
        init.normal_(self.pointwise.weight, mean=0.0, std=std)
        init.zeros_(self.bias)
        if self.depthwise.bias is not None:
            init.zeros_(self.depthwise.bias)

    def forward(self, x: Tensor) -> Tensor:
        """(batch, n, H) -> (batch, n, A)."""
        convolved = depthwise_over_tokens(self.depthwise, x)
        return F.linear(convolved, self.pointwise.weight[:, :, 0], self.bias[:, 0])


class ConvBertMixedAttention(nn.Module):
    """N self-attention heads (optionally with relative terms, ALiBi or rotary positions) + N span-based dynamic conv
    heads."""

    def __init__(self, config):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_self_attention_heads
        if hidden % (2 * self.num_heads):
            raise ValueError(
                f"hidden_size={hidden} must be divisible by 2 * (num_attention_heads // head_ratio) = "
                f"{2 * self.num_heads}: ConvBERT splits H / 2 channels among the self-attention heads"
            )
        bottleneck = hidden // 2
        self.head_size = bottleneck // self.num_heads
        self.kernel_size = config.conv_kernel_size
        self.mask_padding = config.convbert_padding == "masked"
        self.kernel_from_key = config.convbert_kernel_from == "key"
        self.dropout_p = config.attention_probs_dropout_prob
        self.config = config

        self.query = nn.Linear(hidden, bottleneck)
        self.key = nn.Linear(hidden, bottleneck)
        self.value = nn.Linear(hidden, bottleneck)
        self.key_conv_attn_layer = SeparableConv1D(hidden, bottleneck, self.kernel_size,
                                                   depthwise_bias=self.kernel_from_key)
        self.conv_kernel_layer = nn.Linear(bottleneck, self.num_heads * self.kernel_size)
        self.conv_out_layer = nn.Linear(hidden, bottleneck)
        self.relative = position_bias(config, self.num_heads, self.head_size)
        self.rope_theta = config.rope_theta if config.position_embedding_type == "rotary" else None

    def conv_kernels(self, hidden_states: Tensor, query: Tensor, mask: TokenMask) -> Tensor:
        """The span-based kernels, softmaxed over the K taps: (batch, n, H), (batch, n, A) -> (batch, n, N, K).

        kernel[b, i, g, t] weighs position i + t - K//2 in conv head g (also read by the analysis plots)."""
        conv_input = mask.zero_pads(hidden_states) if self.mask_padding else hidden_states
        key_span = self.key_conv_attn_layer(conv_input)
        logits = self.conv_kernel_layer(key_span * query).unflatten(-1, (self.num_heads, self.kernel_size))
        if self.kernel_from_key:
            return self.key_token_kernels(logits, mask)
        return logits.softmax(dim=-1)

    def key_token_kernels(self, logits: Tensor, mask: TokenMask) -> Tensor:
        """Chang et al.'s taps: query i's tap t is logits[j, :, t] of its key j = i + t - K//2, softmaxed over the
        taps whose key is a real token (the others get -10000 before the softmax, as in their code)."""
        taps = shifted_taps(logits, self.kernel_size)
        scores = torch.stack([tap[..., t] for t, tap in enumerate(taps)], dim=-1)  # (batch, n, N, K)
        real_keys = torch.stack(shifted_taps(mask.keep.to(logits.dtype), self.kernel_size), dim=-1) > 0
        return scores.masked_fill(~real_keys[:, :, None, :], -10000.0).softmax(dim=-1)

    def conv_heads(self, hidden_states: Tensor, query: Tensor, mask: TokenMask) -> Tensor:
        """The span-based dynamic convolution: (batch, n, H), (batch, n, A) -> (batch, n, A)."""
        kernel = self.conv_kernels(hidden_states, query, mask)
        if self.kernel_from_key:
            kernel = F.dropout(kernel, self.dropout_p, training=self.training)
        value = self.conv_out_layer(hidden_states)
        if self.mask_padding:
            value = mask.zero_pads(value)
        out = dynamic_conv(value.unflatten(-1, (self.num_heads, self.head_size)), kernel)
        return out.flatten(-2)

    def forward(self, hidden_states: Tensor, mask: TokenMask | PackedSequences, output_attentions: bool = False):
        """hidden_states: a padded batch (batch, n, H) with its TokenMask, or packed sequences (1, total, H)."""
        query, key = self.query(hidden_states), self.key(hidden_states)
        # rotary positions turn the self-attention heads' queries and keys; the span kernels read Q as it is
        attention_query, attention_key, tables_from = rotated_for_attention(
            query, key, mask.token_positions(), self.num_heads, self.rope_theta, self.relative,
            self.config.rotary_relative_terms)
        dropout_p = self.dropout_p if self.training else 0.0
        context, probs = attention_per_sequence(attention_query, attention_key, self.value(hidden_states),
                                                self.num_heads, self.relative, mask, dropout_p=dropout_p,
                                                attn_implementation=attn_implementation(self.config),
                                                need_weights=output_attentions, tables_from=tables_from)
        # the span convolution runs on one sequence per row (the blocks of packed sequences)
        conv = mask.per_block(self.conv_heads, hidden_states, query)
        return torch.cat([context, conv], dim=-1), probs
