"""The results of a comparison, read back from its run directories: per-run metrics, GLUE scores, the CSVs and
the perplexity figure (`report.py` turns them into report.md / report.html).

See `convattn.training.compare` for the directory layout.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from convattn.errors import UsageError
from convattn.files import save_figure, write_text_atomic
from convattn.runs.finetune import GLUE_RESULTS, SQUAD_RESULTS, glue_dir, squad_dir
from convattn.runs.pretrain import FINISHED, read_metrics, run_state
from convattn.training.compare.curves import align_seeds
from convattn.training.compare.grids import RunSpec
from convattn.training.compare.options import MEMORY_FILE, CompareOptions
from convattn.training.seed_statistics import mean_sem

MIB = 2**20


@dataclass
class RunResult:
    spec: RunSpec
    metrics: dict[int, list[dict]]  # seed -> metrics.jsonl rows (seeds that have any)
    finished: list[int]
    memory: dict | None
    downstream: dict[int, dict[str, float]]  # seed -> "GLUE <column>" / "SQuAD v<version> EM|F1" -> dev score

    @property
    def final_perplexity(self) -> dict | None:
        return mean_sem([self.metrics[seed][-1]["perplexity"] for seed in self.finished])

    @property
    def curve_seeds(self) -> list[int]:
        """The seeds a run's curves average: the finished ones (those of its final perplexity), else all so far."""
        return self.finished or sorted(self.metrics)

    @property
    def final_step(self) -> int | None:
        steps = {self.metrics[seed][-1]["step"] for seed in self.finished}
        return max(steps) if steps else None

    @property
    def tokens_per_second(self) -> float | None:
        """Median over evaluations of each seed's training throughput, then the mean over seeds."""
        per_seed = []
        for rows in self.metrics.values():
            rates = [row["tokens_per_second"] for row in rows if row.get("tokens_per_second")]
            if rates:
                per_seed.append(statistics.median(rates))
        return statistics.fmean(per_seed) if per_seed else None

    @property
    def steps_reached(self) -> float | None:
        """Mean over finished seeds of the last step: what a time budget bought."""
        steps = [self.metrics[seed][-1]["step"] for seed in self.finished]
        return statistics.fmean(steps) if steps else None

    @property
    def step_seconds(self) -> dict | None:
        """The spread of a training step's wall time over every seed's evaluations: the median of their medians,
        the lowest 10th and the highest 90th percentile (None for runs recorded before steps were timed)."""
        spreads = [row["step_seconds"] for rows in self.metrics.values() for row in rows if row.get("step_seconds")]
        if not spreads:
            return None
        return {"p10": min(s["p10"] for s in spreads), "median": statistics.median(s["median"] for s in spreads),
                "p90": max(s["p90"] for s in spreads)}

    @property
    def slowed_steps(self) -> float | None:
        """The mean share of training steps that waited for a CPU other processes held (None: not known)."""
        shares = [row["slowed_steps"] for rows in self.metrics.values() for row in rows
                  if row.get("slowed_steps") is not None]
        return statistics.fmean(shares) if shares else None

    @property
    def tokens_seen(self) -> float | None:
        seen = [self.metrics[seed][-1]["tokens_seen"] for seed in self.finished]
        return statistics.fmean(seen) if seen else None

    @property
    def cuda_peak(self) -> int | None:
        peaks = (self.memory or {}).get("cuda_peak_bytes") or {}
        return max(peaks.values()) if peaks else None

    def downstream_score(self, column: str) -> dict | None:
        return mean_sem([scores[column] for scores in self.downstream.values() if column in scores])


def read_downstream(path: Path) -> dict[str, float]:
    """A pretraining seed's fine-tuning results (means over fine-tuning seeds): GLUE columns, SQuAD EM and F1."""
    scores = {}
    glue = glue_dir(path) / GLUE_RESULTS
    if glue.is_file():
        columns = json.loads(glue.read_text())["columns"]
        scores.update({f"GLUE {column}": stat["mean"] for column, stat in columns.items()})
    squad = squad_dir(path) / SQUAD_RESULTS
    if squad.is_file():
        results = json.loads(squad.read_text())
        version = results["version"]
        for label, key in (("EM", "best_exact" if version == "2.0" else "exact_match"),
                           ("F1", "best_f1" if version == "2.0" else "f1")):
            if key in results["scores"]:
                scores[f"SQuAD v{version} {label}"] = results["scores"][key]["mean"]
    for column, score in scores.items():
        if not (isinstance(score, int | float) and math.isfinite(score)):
            folder = glue_dir(path) if column.startswith("GLUE") else squad_dir(path)
            raise UsageError(f"{folder}: the {column} score is {score}, not a finite number (a damaged results file, "
                             f"or one of an older convattn); delete {folder} to fine-tune that seed again")
    return scores


def collect_results(options: CompareOptions) -> list[RunResult]:
    results = []
    for spec in options.grid.runs:
        metrics, finished, downstream = {}, [], {}
        for seed in range(options.seeds):
            path = options.run_path(spec, seed)
            rows = read_metrics(path)
            if rows:
                metrics[seed] = rows
            if rows and run_state(path) == FINISHED:
                finished.append(seed)
            if scores := read_downstream(path):
                downstream[seed] = scores
        memory_file = options.run_path(spec) / MEMORY_FILE
        memory = json.loads(memory_file.read_text()) if memory_file.is_file() else None
        results.append(RunResult(spec, metrics, finished, memory, downstream))
    return results


def seeds_in_output(options: CompareOptions) -> int:
    """How many seeds (0..k) the output directory has runs for (0: none)."""
    found = [int(path.name.removeprefix("seed")) for spec in options.grid.runs
             for path in options.run_path(spec).glob("seed*") if path.name.removeprefix("seed").isdigit()]
    return max(found, default=-1) + 1


def downstream_columns(results: list[RunResult]) -> list[str]:
    """Fine-tuning columns present in any run: GLUE in the papers' order, then SQuAD."""
    from convattn.data.glue import GLUE_COLUMNS

    found = {column for result in results for scores in result.downstream.values() for column in scores}
    order = {f"GLUE {column}": index for index, column in enumerate(GLUE_COLUMNS)}
    return sorted(found, key=lambda column: (order.get(column, len(order)), column))


def _csv_text(header: list[str], rows: list[list]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)  # None as an empty field, as csv writes it
    return buffer.getvalue()


METRIC_COLUMNS = ("step", "perplexity", "eval_loss", "train_loss", "tokens_per_second", "tokens_seen",
                  "learning_rate", "elapsed_seconds", "training_seconds")


def write_metrics_csv(results: list[RunResult], path: Path) -> None:
    rows = [[result.spec.name, result.spec.preset, seed, *(row.get(column) for column in METRIC_COLUMNS)]
            for result in results for seed, seed_rows in result.metrics.items() for row in seed_rows]
    write_text_atomic(path, _csv_text(["run", "preset", "seed", *METRIC_COLUMNS], rows))


def write_summary_csv(results: list[RunResult], path: Path) -> None:
    columns = downstream_columns(results)
    header = ["run", "preset", "overrides", "seeds_finished", "final_step", "parameters", "encoder_parameters",
              "tokens_seen", "tokens_per_second", "train_memory_mib", "cuda_peak_mib", "perplexity_mean",
              "perplexity_std", "perplexity_sem", "perplexity_per_seed"]
    header += [f"{column.replace(' ', '_')}_{stat}" for column in columns for stat in ("mean", "std")]
    rows = []
    for result in results:
        estimate = (result.memory or {}).get("estimate", {})
        ppl = result.final_perplexity or {}
        row = [result.spec.name, result.spec.preset, json.dumps(result.spec.model) if result.spec.model else None,
               len(result.finished), result.final_step, estimate.get("parameters"),
               estimate.get("encoder_parameters"), result.tokens_seen, _round(result.tokens_per_second, 1),
               _round(estimate.get("total_bytes") and estimate["total_bytes"] / MIB, 1),
               _round(result.cuda_peak and result.cuda_peak / MIB, 1), _round(ppl.get("mean"), 3),
               _round(ppl.get("std"), 3), _round(ppl.get("sem"), 3),
               ";".join(f"{v:.3f}" for v in ppl.get("values", []))]
        for column in columns:
            score = result.downstream_score(column) or {}
            row += [_round(score.get("mean"), 2), _round(score.get("std"), 2)]
        rows.append(row)
    write_text_atomic(path, _csv_text(header, rows))


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "x")
BAND_NOTE = "line: mean over seeds, each seed's curve interpolated onto common points; band: the seeds' min to max"


def perplexity_figure(results: list[RunResult], title: str):
    """One line per run: mean eval perplexity over seeds at each step, shaded between the seeds' min and max;
    log-scale y (the Conv-Linformer paper's Figure 1) with plain-number tick labels."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5))
    ax = fig.subplots()
    draw_perplexity_curves(ax, results, lambda row: row["step"])
    ax.set(xlabel="training step", title=f"{title}\n({BAND_NOTE})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return fig


def perplexity_cost_figure(results: list[RunResult], title: str, budget: float):
    """A time-budget comparison's curves against what the runs spent: training time (the budget's clock, which
    stops at the deadline, so every seed's last evaluation falls on it) and tokens seen."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 5))
    by_time, by_tokens = fig.subplots(1, 2, sharey=True)
    draw_perplexity_curves(by_time, results, lambda row: min(row["training_seconds"], budget) / 60
                           if "training_seconds" in row else None)
    draw_perplexity_curves(by_tokens, results, lambda row: row.get("tokens_seen"))
    by_time.set(xlabel="training time (minutes; evaluation not counted)")
    by_tokens.set(xlabel="tokens seen (non-padding)", ylabel="")
    fig.suptitle(f"{title}\n({BAND_NOTE})")
    by_tokens.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.subplots_adjust(top=0.85)
    return fig


def draw_perplexity_curves(ax, results: list[RunResult], x_of) -> None:
    """One line per run on `ax`: the seeds' mean eval perplexity against x_of(metrics row) (rows it gives None
    are left out), shaded between their min and max; log-scale y with plain-number tick labels."""
    import matplotlib
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        """LogFormatter's choice of ticks to label, written as 12,000 rather than 1e+04."""

        def _num_to_string(self, x, vmin, vmax):
            return f"{x:,.0f}" if x >= 1 else f"{x:.2g}"

    shown = [result for result in results if result.metrics]
    cmap = matplotlib.colormaps["tab20" if len(shown) > 10 else "tab10"]
    for index, result in enumerate(shown):
        seeds = result.curve_seeds
        curves = [[(x, row["perplexity"]) for row in result.metrics[seed] if (x := x_of(row)) is not None]
                  for seed in seeds]
        band = align_seeds(curves)
        if band is None:
            continue
        color = cmap(index % cmap.N)
        # line style and marker change with the colour, so runs whose curves coincide stay visible
        ax.plot(band.x, band.mean, color=color, linewidth=1.5, linestyle=LINE_STYLES[index % len(LINE_STYLES)],
                marker=MARKERS[index % len(MARKERS)], markersize=3.5, markerfacecolor="none",
                label=f"{result.spec.name} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})")
        if len(seeds) > 1:
            ax.fill_between(band.x, band.low, band.high, color=color, alpha=0.18, linewidth=0)
    ax.set(ylabel="eval perplexity (log scale)", yscale="log")
    for set_formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        set_formatter(PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    ax.grid(True, which="both", alpha=0.3)


def plot_perplexity_curves(results: list[RunResult], title: str, path: Path) -> Path:
    return save_figure(perplexity_figure(results, title), path)


def plot_perplexity_by_cost(results: list[RunResult], title: str, budget: float, path: Path) -> Path:
    return save_figure(perplexity_cost_figure(results, title, budget), path)
