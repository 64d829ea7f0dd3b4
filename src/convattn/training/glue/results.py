"""Every finished run of an output directory -> glue_results.json, glue_results.md and submission/."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from convattn.data.glue import GLUE_COLUMNS
from convattn.files import write_json_atomic, write_text_atomic
from convattn.runs.environment import mixed_code_warning
from convattn.runs.finetune import GLUE_RESULTS
from convattn.runs.folder import seed_dir
from convattn.training.finetune.settings import UNRECORDED
from convattn.training.seed_statistics import format_mean_sem, mean_sem


def collect_runs(output_dir: Path) -> dict[str, dict[int, dict]]:
    runs: dict[str, dict[int, dict]] = {}
    for marker in sorted((output_dir / "runs").glob("*/seed*/run.json")):
        run = json.loads(marker.read_text())
        runs.setdefault(run["task"], {})[run["seed"]] = run
    return runs


def best_seed(task_runs: dict[int, dict]) -> int:
    def task_score(seed: int) -> float:
        score = np.mean(list(task_runs[seed]["scores"].values()))
        return -math.inf if math.isnan(score) else score

    return max(sorted(task_runs), key=task_score)


def aggregate(output_dir: Path) -> dict:
    """Every finished run under output_dir -> glue_results.json, glue_results.md and submission/."""
    runs = collect_runs(output_dir)
    tasks: dict[str, dict] = {}
    columns: dict[str, dict] = {}
    for name, task_runs in runs.items():
        seeds = sorted(task_runs)
        entry: dict = {"seeds": seeds, "runs": {str(s): task_runs[s]["metrics"] for s in seeds}}
        splits = task_runs[seeds[0]]["metrics"]
        if splits:
            entry["metrics"] = {split: {metric: mean_sem([task_runs[s]["metrics"][split][metric] for s in seeds])
                                        for metric in splits[split]} for split in splits}
            entry["best_seed"] = best_seed(task_runs)
            entry["settings"] = task_runs[seeds[0]]["settings"]
            entry["init"] = task_runs[seeds[0]]["init"]
            for column in task_runs[seeds[0]]["scores"]:
                per_seed = {s: task_runs[s]["scores"][column] for s in seeds}
                columns[column] = {**mean_sem(list(per_seed.values())), "per_seed": per_seed}
        tasks[name] = entry

    present = [c for c in GLUE_COLUMNS if c in columns]
    glue: dict = {"columns": present, "complete": len(present) == len(GLUE_COLUMNS)}
    if present:
        common = set.intersection(*(set(columns[c]["per_seed"]) for c in present))
        per_seed = {s: float(np.mean([columns[c]["per_seed"][s] for c in present])) for s in sorted(common)}
        if per_seed:
            glue.update(mean_sem(list(per_seed.values())), per_seed=per_seed)

    any_run = next((r for t in runs.values() for r in t.values() if r["settings"]), None)
    results = {
        "model": any_run["model"] if any_run else None,
        "encoder_params": any_run["encoder_params"] if any_run else None,
        "tasks": tasks,
        "columns": columns,
        "glue": glue,
        "submission": collect_submission(output_dir, runs, tasks),
        "warnings": [f"{name} seed {seed}: {warning}" for name, task_runs in runs.items()
                     for seed, run in sorted(task_runs.items()) for warning in run.get("warnings", [])],
    }
    if mixed := mixed_code_warning([(f"{name} seed {seed}", run) for name, task_runs in runs.items()
                                    for seed, run in sorted(task_runs.items())]):
        results["warnings"].append(mixed)
    write_json_atomic(output_dir / GLUE_RESULTS, results)
    write_text_atomic(output_dir / "glue_results.md", results_markdown(results))
    return results


def collect_submission(output_dir: Path, runs: dict[str, dict[int, dict]], tasks: dict[str, dict]) -> dict[str, str]:
    """Copy each task's best-dev seed's test predictions into submission/ (AX: the best MNLI seed's)."""
    chosen = {}
    for name, task_runs in runs.items():
        seed = tasks.get("mnli", {}).get("best_seed") if name == "ax" else tasks[name].get("best_seed")
        if seed not in task_runs:
            continue
        for file in task_runs[seed]["test_predictions"]:
            source = seed_dir(output_dir, name, seed) / "predictions" / file
            write_text_atomic(output_dir / "submission" / file, source.read_text())
            chosen[file] = f"{name} seed {seed}"
    return chosen


def cell(stat: dict | None, digits: int = 1) -> str:
    return format_mean_sem(stat, digits)


def results_markdown(results: dict) -> str:
    model = Path(results["model"]).name if results["model"] else "?"
    params = f"{results['encoder_params'] / 1e6:.2f}M" if results["encoder_params"] else "–"
    glue = results["glue"]
    glue_cell = cell(glue if "mean" in glue else None)
    if "mean" in glue and not glue["complete"]:
        glue_cell += "*"
    header = ["Model", "Params", *GLUE_COLUMNS, "GLUE"]
    row = [model, params, *(cell(results["columns"].get(c)) for c in GLUE_COLUMNS), glue_cell]
    lines = [
        f"# GLUE dev results: {model}",
        "",
        "Dev-set scores x 100, mean ± standard error of the mean over fine-tuning seeds (layout of Chang et al. "
        "2021, Table 6). MRPC and QQP: mean of accuracy and F1; STS: mean of Pearson and Spearman; CoLA: MCC; "
        "others: accuracy. GLUE: mean of the columns, computed per seed, then mean ± SEM over seeds (WNLI left out, "
        "as in the papers). Params: encoder without the task head.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", "---:", *["---:"] * (len(header) - 2)]) + "|",
        "| " + " | ".join(row) + " |",
    ]
    if "mean" in glue and not glue["complete"]:
        lines += ["", f"\\* partial GLUE score: mean of {', '.join(glue['columns'])} only."]
    if results["warnings"]:
        lines += ["", "## Warnings", "", *(f"- {warning}" for warning in results["warnings"])]
    lines += ["", "## Per metric", "", "| Task | Dev set | Metric | Mean ± SEM | Seeds | Best seed |",
              "|---|---|---|---:|---:|---:|"]
    for name, entry in results["tasks"].items():
        for split, metrics in entry.get("metrics", {}).items():
            for metric, stat in metrics.items():
                lines.append(f"| {name} | {split} | {metric} | {cell(stat, 2)} | {stat['n']} | {entry['best_seed']} |")
    lines += ["", "## Settings", "",
              "| Task | Init | LR | Batch | Epochs | Max steps | Warmup | WD | Layer decay | Max len | Train set | "
              "Precision |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, entry in results["tasks"].items():
        s = entry.get("settings")
        if s:
            lines.append(f"| {name} | {entry['init']} | {s['learning_rate']:g} | {s['batch_size']} | {s['epochs']:g} | "
                         f"{s['max_steps'] or '–'} | {s['warmup_ratio']:g} | {s['weight_decay']:g} | "
                         f"{s['layer_decay']:g} | {s['max_length']} | {s['max_train_samples'] or 'all'} | "
                         f"{s.get('precision', UNRECORDED['precision'])} |")
    if results["submission"]:
        lines += ["", "Test predictions (GLUE submission format) in `submission/`: "
                  + ", ".join(f"{f} ({src})" for f, src in results["submission"].items()) + "."]
    return "\n".join(lines) + "\n"
