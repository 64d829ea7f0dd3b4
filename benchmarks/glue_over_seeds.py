"""GLUE dev over pretraining seeds: each row's `convattn glue` output folders, one per pretraining seed, as one table.

Each folder's glue_results.json gives every task's score per fine-tuning seed; a pretraining seed's score is their
mean, and a row's cell the mean ± SEM over its pretraining seeds (so the spread is pretraining noise, with the
fine-tuning noise averaged inside each seed). The last column is the mean of the row's tasks, per pretraining seed.

    python benchmarks/glue_over_seeds.py \\
        --row absolute=runs/glue63/absolute,runs/glue63/absolute-seed1,runs/glue63/absolute-seed2 \\
        --row rotary=runs/glue63/rotary,runs/glue63/rotary-seed1 --output glue_positions.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import harness

from convattn.runs.finetune import GLUE_RESULTS
from convattn.training.seed_statistics import format_mean_sem, mean_sem


def row_argument(text: str) -> tuple[str, list[Path]]:
    name, _, folders = text.partition("=")
    if not name or not folders:
        raise argparse.ArgumentTypeError(f"--row {text!r}: write NAME=FOLDER[,FOLDER...]")
    paths = [Path(folder) for folder in folders.split(",")]
    for path in paths:
        if not (path / GLUE_RESULTS).is_file():
            raise argparse.ArgumentTypeError(f"--row {name}: {path} has no {GLUE_RESULTS}: give the --output-dir of "
                                             "a finished `convattn glue`")
    return name, paths


def seed_scores(folder: Path) -> dict[str, float]:
    """A pretraining seed's score per column (the mean over its fine-tuning seeds)."""
    columns = json.loads((folder / GLUE_RESULTS).read_text())["columns"]
    return {column: stat["mean"] for column, stat in columns.items()}


def table(rows: list[tuple[str, list[Path]]], run: harness.Run) -> list[str]:
    """The markdown table; each row's figures (per column and the tasks' mean: per seed, mean, SEM) kept in `run`."""
    per_row = {name: [seed_scores(folder) for folder in folders] for name, folders in rows}
    columns = [c for c in next(iter(per_row.values()))[0] if all(c in s for seeds in per_row.values() for s in seeds)]
    lines = ["| row | pretraining seeds | " + " | ".join(columns) + " | mean of the tasks |",
             "|---|---:|" + "---:|" * (len(columns) + 1)]
    for name, folders in rows:
        seeds = per_row[name]
        stats = {c: mean_sem([s[c] for s in seeds]) for c in columns}
        stats["mean of the tasks"] = mean_sem([statistics.fmean(s[c] for c in columns) for s in seeds])
        run.add(row=name, folders=[str(p) for p in folders],
                **{c: {k: stat[k] for k in ("values", "mean", "sem")} for c, stat in stats.items()})
        lines.append(f"| {name} | {len(seeds)} | " + " | ".join(format_mean_sem(stat) for stat in stats.values())
                     + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--row", type=row_argument, action="append", required=True,
                        help="NAME=FOLDER[,FOLDER...]: a row and its `convattn glue` output folders, one a "
                             "pretraining seed")
    parser.add_argument("--output", default="glue_over_seeds.md", help="file name in benchmarks/results")
    args = parser.parse_args()
    about = ("Dev scores x 100: per pretraining seed the mean over its fine-tuning seeds, then mean ± SEM over the "
             "pretraining seeds (one seed: its mean alone). Folders: " + "; ".join(
                 f"{name}: {', '.join(str(p) for p in paths)}" for name, paths in args.row))
    with harness.Run("glue_over_seeds", machine="-") as run:  # figures of finished runs: no machine measured
        lines = [*harness.heading("GLUE dev over pretraining seeds", about), "", *table(args.row, run)]
    return harness.report(harness.results_dir() / args.output, lines)


if __name__ == "__main__":
    sys.exit(main())
