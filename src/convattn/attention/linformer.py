"""Linformer (Wang et al. 2020) and Conv-Linformer (Malard) self-attention.

Keys and values (after their linear maps, full width, before the head split) are shortened along the
sequence from n to k positions, so attention costs O(n k) instead of O(n^2):

    softmax(Q (P_K K)^T / sqrt(d)) (P_V V)

P is either Linformer's learned matrix E / F of shape (k, n_max) ("linear") or a strided Conv1d with
kernel = stride = n_max // k ("conv", Conv-Linformer). E is applied the way the Linformer authors' fairseq
code does: to the input, before the key / value maps, so each projected key gets its bias once,
K = (E X) W_K + b_K (`linformer_bias="after_projection"`); "before_projection" keeps the order
E (X W_K + b_K). The convolution runs after the maps, as in Malard's code. Pad rows of the input (or of
K and V) are zeroed before the projection, so outputs at real positions do not depend on padding. An
input of n < n_max tokens behaves exactly as if zero-padded to n_max: the linear projection uses the
first n columns of E, the convolution treats the missing windows as zeros. The k projected keys are not
token positions, so no key mask applies.

Padding-free batches: E / F and the strided convolution project a sequence of a fixed length, so a model with
Linformer layers takes padded batches only; a flattened batch (transformers' `DataCollatorWithFlattening`:
one row, position_ids restarting per sequence) is refused with an error, and padded batches are computed as
they are, pad rows included (`ConvAttnModel.takes_packed_sequences`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import initialization as init

from convattn.attention.core import TokenMask, attend, attn_implementation, merge_heads, split_heads


def check_length(n: int, max_length: int) -> None:
    if n > max_length:
        raise ValueError(
            f"sequence length {n} exceeds max_position_embeddings={max_length}, the length the Linformer "
            "projections were built for; truncate the input or build the model with a larger max_position_embeddings"
        )


def zero_rows_after(x: Tensor, count: int) -> Tensor:
    """(batch, n, C) -> (batch, n + count, C), zeros appended. Not F.pad: compiled with a dynamic length, the
    backward of a padding that turns out to be 0 rows expects a contiguous gradient where eager keeps the
    conv's transposed one, and a later view fails (torch 2.13)."""
    return torch.cat([x, x.new_zeros(x.shape[0], count, x.shape[2])], dim=1)


class LinearSequenceProjection(nn.Module):
    """Linformer's E: (batch, n, channels) -> (batch, k, channels), E x with E of shape (k, n_max)."""

    def __init__(self, max_length: int, k: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(k, max_length))

    def init_weights(self, std: float) -> None:
        init.normal_(self.weight, mean=0.0, std=std)

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[1]
        check_length(n, self.weight.shape[1])
        return self.weight[:, :n] @ x  # the first n columns: x zero-padded to n_max gives the same result


class ConvSequenceProjection(nn.Conv1d):
    """Conv-Linformer's strided Conv1d(C, C, kernel = stride = n_max // k, bias=False) along the sequence:
    (batch, n, C) -> (batch, k, C). "dense" mixes all channels (the author's code); "depthwise"
    (groups = C) convolves each channel on its own."""

    def __init__(self, channels: int, max_length: int, k: int, kind: str):
        stride = max_length // k
        groups = channels if kind == "depthwise" else 1
        super().__init__(channels, channels, stride, stride=stride, groups=groups, bias=False)
        self.max_length, self.k = max_length, k

    def init_weights(self, std: float) -> None:
        init.normal_(self.weight, mean=0.0, std=std)

    def forward(self, x: Tensor) -> Tensor:
        n, stride = x.shape[1], self.stride[0]
        check_length(n, self.max_length)
        # zero-pad to whole windows, convolve, then append the windows that would only see the
        # zero padding up to n_max: without a bias they are exactly zero
        windows = -(-n // stride)
        out = super().forward(zero_rows_after(x, windows * stride - n).transpose(1, 2)).transpose(1, 2)
        return zero_rows_after(out, self.k - windows)


def sequence_projection(config, kind: str) -> nn.Module:
    n_max, k = config.max_position_embeddings, config.linformer_k
    if kind == "linear":
        return LinearSequenceProjection(n_max, k)
    return ConvSequenceProjection(config.hidden_size, n_max, k, config.linformer_conv)


class LinformerSelfAttention(nn.Module):
    """softmax(Q (P_K K)^T / sqrt(d)) (P_V V) for all heads; P_K, P_V shared across heads.

    Sharing (`linformer_sharing`): "headwise" = one P_K and one P_V per layer, "key_value" = P_K = P_V
    per layer, "layerwise" = one projection for K and V of every layer, owned by the encoder's `shared`.
    """

    def __init__(self, config, layer_idx: int, shared: nn.ModuleDict):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.dropout_p = config.attention_probs_dropout_prob
        self.config = config
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        kind = config.layer_projections[layer_idx]
        self.bias_after_projection = kind == "linear" and config.linformer_bias == "after_projection"
        if config.linformer_sharing == "headwise":
            self.key_projection = sequence_projection(config, kind)
            self.value_projection = sequence_projection(config, kind)
        elif config.linformer_sharing == "key_value":
            self.key_value_projection = sequence_projection(config, kind)
        else:
            if "linformer_projection" not in shared:
                shared["linformer_projection"] = sequence_projection(config, kind)
            # a plain tuple is not registered as a submodule, so the shared projection's parameters
            # appear once in state_dict / named_parameters, under the encoder that owns them
            self.layerwise_projection = (shared["linformer_projection"],)

    @property
    def projections(self) -> tuple[nn.Module, nn.Module]:
        """The (key, value) sequence projections."""
        if hasattr(self, "key_projection"):
            return self.key_projection, self.value_projection
        if hasattr(self, "key_value_projection"):
            return self.key_value_projection, self.key_value_projection
        return self.layerwise_projection * 2

    def projected_keys_values(self, hidden_states: Tensor, mask: TokenMask) -> tuple[Tensor, Tensor]:
        """The k projected keys and values, (batch, k, H) each; pad rows never reach the projection."""
        key_projection, value_projection = self.projections
        if self.bias_after_projection:
            real = mask.zero_pads(hidden_states)
            projected = key_projection(real)
            projected_for_values = projected if value_projection is key_projection else value_projection(real)
            return self.key(projected), self.value(projected_for_values)
        # the pad rows carry the key / value biases here, so they are zeroed after the maps
        keys = key_projection(mask.zero_pads(self.key(hidden_states)))
        values = value_projection(mask.zero_pads(self.value(hidden_states)))
        return keys, values

    def forward(self, hidden_states: Tensor, mask: TokenMask, output_attentions: bool = False):
        q = split_heads(self.query(hidden_states), self.num_heads)
        keys, values = self.projected_keys_values(hidden_states, mask)
        k, v = split_heads(keys, self.num_heads), split_heads(values, self.num_heads)
        context, probs = attend(
            q, k, v, bias=None, mask=None, dropout_p=self.dropout_p if self.training else 0.0,
            attn_implementation=attn_implementation(self.config), need_weights=output_attentions,
        )
        return merge_heads(context), probs
