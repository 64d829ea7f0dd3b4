"""Average attention map per layer for one text (and ConvBERT's per-position conv kernels)."""

from __future__ import annotations

from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor

from convattn.files import save_figure


@torch.no_grad()
def attention_maps(model, input_ids: Tensor) -> dict[int, Tensor]:
    """Layer index -> the (n, n) softmax attention averaged over its self-attention heads (one text)."""
    out = model(input_ids=input_ids, output_attentions=True)
    return {layer: probs[0].mean(dim=0) for layer, probs in enumerate(out.attentions) if probs is not None}


def plot_attention_maps(maps: dict[int, Tensor], tokens: list[str], title: str, path: Path) -> Path:
    return plot_token_matrices(maps, tokens, title, path, xlabel="key token j", ylabel="query token i",
                               colorbar="attention probability")


def plot_token_matrices(matrices: dict[int, Tensor], tokens: list[str], title: str, path: Path, *, xlabel: str,
                        ylabel: str, colorbar: str) -> Path:
    """One (n, n) heatmap per layer, tokens on both axes (when there are at most 40)."""
    count = len(matrices)
    cols = min(4, count)
    rows = -(-count // cols)
    n = len(tokens)
    fig = Figure(figsize=(3.6 * cols, 3.4 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    for ax, (layer, matrix) in zip(axes.flat, matrices.items(), strict=False):
        image = ax.imshow(matrix.float().numpy(), cmap="viridis", vmin=0, vmax=float(matrix.max()))
        ax.set_title(f"layer {layer}", fontsize=9)
        if n <= 40:
            ax.set_xticks(range(n), tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(n), tokens, fontsize=6)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046, label=colorbar)
    fig.suptitle(title)
    return save_figure(fig, path)
