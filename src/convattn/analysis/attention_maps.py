"""Average attention map per layer for one text (and ConvBERT's per-position conv kernels)."""

from __future__ import annotations

from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor

from convattn.analysis.io import save_figure


@torch.no_grad()
def attention_maps(model, input_ids: Tensor) -> list[Tensor]:
    """Per layer, the (n, n) softmax attention averaged over the self-attention heads (one text)."""
    out = model(input_ids=input_ids, output_attentions=True)
    return [probs[0].mean(dim=0) for probs in out.attentions if probs is not None]


def plot_attention_maps(maps: list[Tensor], tokens: list[str], title: str, path: Path) -> Path:
    layers = len(maps)
    cols = min(4, layers)
    rows = -(-layers // cols)
    n = len(tokens)
    fig = Figure(figsize=(3.2 * cols, 3.2 * rows + 0.6))
    axes = fig.subplots(rows, cols, squeeze=False)
    for index, ax in enumerate(axes.flat):
        if index >= layers:
            ax.set_visible(False)
            continue
        image = ax.imshow(maps[index].float().numpy(), cmap="viridis", vmin=0, vmax=float(maps[index].max()))
        ax.set_title(f"layer {index}", fontsize=9)
        if n <= 40:
            ax.set_xticks(range(n), tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(n), tokens, fontsize=6)
        ax.set_xlabel("key token j", fontsize=8)
        ax.set_ylabel("query token i", fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046, label="attention probability")
    fig.suptitle(title)
    return save_figure(fig, path)
