"""Final eval perplexity (and GLUE dev score) against ConvBERT's convolution kernel size (Jiang et al. 2020,
Figure 5 style), from the runs of a `convattn plot kernel-size` sweep."""

from __future__ import annotations

import statistics
from pathlib import Path

from matplotlib.figure import Figure

from convattn.files import save_figure


def _plot_against_size(ax, sizes: list[int], per_size: list[list[float]], ylabel: str, color: str) -> None:
    """Mean over seeds with a ± std bar, and each seed as a dot."""
    shown = [(k, values) for k, values in zip(sizes, per_size, strict=True) if values]
    if not shown:
        return
    means = [statistics.fmean(values) for _, values in shown]
    stds = [statistics.stdev(values) if len(values) > 1 else 0.0 for _, values in shown]
    several = any(len(values) > 1 for _, values in shown)
    ax.errorbar([k for k, _ in shown], means, yerr=stds if several else None, color=color, marker="o", capsize=3,
                linewidth=1.5, label="mean ± std over seeds" if several else "one seed")
    for k, values in shown:
        ax.scatter([k] * len(values), values, color=color, alpha=0.35, s=12, linewidths=0)
    ax.set(xlabel="convolution kernel size K", ylabel=ylabel)
    ax.set_xticks(sizes)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, frameon=False)


def plot_kernel_size_sweep(sizes: list[int], perplexities: list[list[float]], glue_scores: list[list[float]] | None,
                           title: str, path: Path) -> Path:
    """perplexities[i] / glue_scores[i]: one value per finished seed of kernel size sizes[i]."""
    panels = 2 if glue_scores else 1
    fig = Figure(figsize=(5.2 * panels, 4))
    axes = fig.subplots(1, panels, squeeze=False)[0]
    _plot_against_size(axes[0], sizes, perplexities, "final eval perplexity (lower is better)", "tab:blue")
    if glue_scores:
        _plot_against_size(axes[1], sizes, glue_scores, "GLUE dev score (higher is better)", "tab:green")
    fig.suptitle(title)
    return save_figure(fig, path)
