"""ConvBERT's kernel-size sweep (Jiang et al. 2020, Fig. 5): one comparison run per convolution kernel size of a
ConvBERT preset, then final eval perplexity (and the mean GLUE dev score, when fine-tuned) against the size."""

from __future__ import annotations

import statistics

from convattn.errors import UsageError, option
from convattn.training.compare.grids import Grid, RunSpec, check_runs
from convattn.training.compare.options import CompareOptions


def kernel_size_grid(preset: str, sizes: list[int]) -> Grid:
    """The runs `k=<size>` of `preset` (which must have ConvBERT's convolution)."""
    from convattn import ConvAttnConfig

    check_runs([RunSpec(preset, preset)])
    if not ConvAttnConfig.from_preset(preset).uses_convbert:
        raise UsageError(f"{option('preset')} {preset} has no ConvBERT convolution (head_ratio 1); use a ConvBERT "
                         "preset such as chang2021-small/convbert or convbert/small")
    runs = [RunSpec(f"k={k}", preset, {"conv_kernel_size": k}) for k in sizes]
    return Grid(f"kernel size ({preset})", runs, description=f"{preset} with convolution kernel sizes "
                f"{', '.join(map(str, sizes))} (span-based dynamic convolution and separable key convolution).")


def plot_sweep(options: CompareOptions, preset: str, sizes: list[int]) -> str:
    """kernel_size.png of a finished (or partly finished) sweep; returns where it was written."""
    from convattn.analysis.kernel_size import plot_kernel_size_sweep
    from convattn.training.compare.results import collect_results, downstream_columns

    results = collect_results(options)
    perplexities = [[result.metrics[seed][-1]["perplexity"] for seed in result.finished] for result in results]
    columns = [column for column in downstream_columns(results) if column.startswith("GLUE ")]
    glue = [[statistics.fmean(scores[c] for c in columns) for scores in result.downstream.values()
             if all(c in scores for c in columns)] for result in results] if columns else None
    budget = results[0].final_step
    title = f"{preset}: kernel size sweep" + (f" ({budget:,} steps)" if budget else "")
    return plot_kernel_size_sweep(sizes, perplexities, glue, title, options.output_dir / "kernel_size.png")
