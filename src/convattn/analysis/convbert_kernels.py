"""ConvBERT's span-based dynamic convolution kernels, per token (in the style of Jiang et al. 2020, Figure 2).

Each token i gets its own softmaxed kernel over the K positions i - K//2 .. i + K//2. Laid out as an (n, n)
matrix (row i: token i's kernel at those columns, zero elsewhere) it reads like an attention map that can
only look K//2 tokens either way. Weights on positions outside the sequence (the zero padding of the
convolution) have no column, so the first and last K//2 rows sum to less than 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from convattn.attention.convbert import ConvBertMixedAttention


def spread_kernels(kernels: Tensor) -> Tensor:
    """(n, K) kernel per position -> (n, n) with [i, i + t - K//2] = kernels[i, t] (taps outside dropped)."""
    n, taps = kernels.shape
    half = taps // 2
    padded = kernels.new_zeros(n, n + 2 * half)  # column c of padded is position c - half
    rows = torch.arange(n)
    for t in range(taps):
        padded[rows, rows + t] = kernels[:, t]
    return padded[:, half : half + n]


@torch.no_grad()
def position_kernels(model, input_ids: Tensor, attention_mask: Tensor | None = None) -> dict[int, Tensor]:
    """Layer index -> (n, n) per-token kernels of the first text, averaged over the conv heads; empty if the
    model has no ConvBERT layers."""
    captured: dict[int, Tensor] = {}

    def capture(layer: int):
        def hook(module: ConvBertMixedAttention, args, output):
            hidden_states, mask = args[0], args[1]
            captured[layer] = module.conv_kernels(hidden_states, module.query(hidden_states), mask)
        return hook

    hooks = [layer.attention.self.register_forward_hook(capture(index))
             for index, layer in enumerate(model.encoder.layer)
             if isinstance(layer.attention.self, ConvBertMixedAttention)]
    try:
        if hooks:
            model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        for hook in hooks:
            hook.remove()
    return {layer: spread_kernels(kernels[0].mean(dim=1)) for layer, kernels in sorted(captured.items())}
