"""What the convolutions learned: the composite paper's Figures 2 and 3, and dynamic kernels.

* fixed lightweight kernels beta[layer, head, offset] (Chang et al. 2021, Fig. 2);
* depthwise value kernels per channel, sorted by their previous-vs-next-token preference (Fig. 3);
* dynamic (query-based) kernels q_i . W[:, offset] / sqrt(d), averaged over the tokens of a text.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor

from convattn.files import save_figure


def relative_modules(model) -> list:
    """The RelativePositionBias module of each layer (None where a layer has none)."""
    return [getattr(layer.attention.self, "relative", None) for layer in model.encoder.layer]


def fixed_kernels(model) -> Tensor | None:
    """(layers, heads, 2r + 1) fixed kernels beta, or None if the model has none."""
    tables = [m.fixed.detach() for m in relative_modules(model) if m is not None and m.fixed is not None]
    return torch.stack(tables) if tables else None


def depthwise_kernels(model, layer: int = -1) -> Tensor | None:
    """(channels, taps) kernel of the depthwise convolution on values in one layer (default: deepest)."""
    conv = getattr(model.encoder.layer[layer].attention.self, "value_conv", None)
    return None if conv is None else conv.weight.detach()[:, 0, :]


def sort_by_adjacent_preference(kernels: Tensor) -> Tensor:
    """Order channels by weight on the previous token minus weight on the next token (Fig. 3).

    A Conv1d tap t reads position i + t - r, so tap r - 1 is the previous token and r + 1 the next."""
    reach = kernels.shape[1] // 2
    preference = kernels[:, reach - 1] - kernels[:, reach + 1]
    return kernels[preference.argsort(descending=True)]


@torch.no_grad()
def dynamic_kernels(model, input_ids: Tensor, attention_mask: Tensor) -> Tensor | None:
    """(layers, heads, 2r + 1): q_i . W / sqrt(d) averaged over the real tokens of the batch."""
    captured: dict[int, Tensor] = {}
    hooks = []
    for index, layer in enumerate(model.encoder.layer):
        attention = layer.attention.self
        if getattr(attention, "relative", None) is not None and attention.relative.query_kernel is not None:
            hooks.append(attention.query.register_forward_hook(
                lambda module, args, out, index=index: captured.__setitem__(index, out)))
    if not hooks:
        return None
    try:
        model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        for hook in hooks:
            hook.remove()
    keep = attention_mask.bool()
    tables = []
    for index in sorted(captured):
        attention = model.encoder.layer[index].attention.self
        heads = attention.num_heads
        q = captured[index].unflatten(-1, (heads, -1))  # (batch, n, heads, d)
        table = q @ attention.relative.query_kernel / math.sqrt(q.shape[-1])  # (batch, n, heads, 2r + 1)
        tables.append(table[keep].mean(dim=0))
    return torch.stack(tables)


def _offset_axis(ax, width: int) -> None:
    reach = width // 2
    ticks = list(range(0, width, max(1, reach // 2)))
    ax.set_xticks(ticks, [str(t - reach) for t in ticks])
    ax.set_xlabel("relative position j − i (tokens)")


def plot_layer_head_kernels(kernels: Tensor, title: str, path: Path) -> Path:
    """One heatmap row per layer: heads x relative offsets, one shared, centred colour scale."""
    layers, heads, width = kernels.shape
    limit = float(kernels.abs().max()) or 1.0
    fig = Figure(figsize=(6, 0.45 * heads * layers + 1.2))
    axes = fig.subplots(layers, 1, squeeze=False, sharex=True)
    for layer, ax in enumerate(axes[:, 0]):
        image = ax.imshow(kernels[layer].float().numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
        ax.set_yticks(range(heads), [f"h{h}" for h in range(heads)], fontsize=7)
        ax.set_ylabel(f"layer {layer}", rotation=0, ha="right", va="center", fontsize=8)
    _offset_axis(axes[-1, 0], width)
    fig.colorbar(image, ax=axes[:, 0].tolist(), label="added attention score (logit)", shrink=0.8)
    fig.suptitle(title)
    return save_figure(fig, path)


def plot_depthwise_kernels(kernels: Tensor, title: str, path: Path) -> Path:
    sorted_kernels = sort_by_adjacent_preference(kernels.float())
    limit = float(sorted_kernels.abs().max()) or 1.0
    fig = Figure(figsize=(6, 7))
    ax = fig.subplots()
    image = ax.imshow(sorted_kernels.numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto",
                      interpolation="nearest")
    ax.set_ylabel("channel (sorted: prefers previous token at top, next token at bottom)")
    _offset_axis(ax, kernels.shape[1])
    fig.colorbar(image, ax=ax, label="kernel weight")
    ax.set_title(title)
    return save_figure(fig, path)
