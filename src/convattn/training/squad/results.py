"""Every finished seed of an output directory -> squad_results.json and squad_results.md."""

from __future__ import annotations

import json
from pathlib import Path

from convattn.files import write_json_atomic, write_text_atomic
from convattn.runs.environment import mixed_code_warning
from convattn.runs.finetune import SQUAD_RESULTS
from convattn.training.seed_statistics import format_mean_sem, mean_sem

# the columns of the table, as the official evaluators name them (v2.0: best_* use the threshold chosen on dev)
HEADLINE = {"1.1": (("EM", "exact_match"), ("F1", "f1")),
            "2.0": (("EM", "best_exact"), ("F1", "best_f1"), ("HasAns EM", "HasAns_exact"),
                    ("HasAns F1", "HasAns_f1"), ("NoAns EM", "NoAns_exact"), ("NoAns F1", "NoAns_f1"))}
TOTALS = ("total", "HasAns_total", "NoAns_total")


def collect_runs(output_dir: Path, version: str) -> dict[int, dict]:
    runs = {}
    for marker in sorted((output_dir / "runs" / f"squad{version}").glob("seed*/run.json")):
        run = json.loads(marker.read_text())
        runs[run["seed"]] = run
    return runs


def aggregate(output_dir: Path, version: str) -> dict:
    """Mean ± SEM over seeds of every score the evaluator reports (counts and thresholds per seed only)."""
    runs = collect_runs(output_dir, version)
    seeds = sorted(runs)
    first = runs[seeds[0]] if seeds else None
    scores = {}
    if first:
        for name in first["scores"]:
            if name not in TOTALS and not name.endswith("_thresh"):
                scores[name] = mean_sem([runs[s]["scores"][name] for s in seeds])
    results = {
        "version": version,
        "model": first["model"] if first else None,
        "encoder_params": first["encoder_params"] if first else None,
        "settings": first["settings"] if first else None,
        "seeds": seeds,
        "scores": scores,
        "runs": {str(s): runs[s]["scores"] for s in seeds},
        "best_seed": max(seeds, key=lambda s: (runs[s]["scores"].get("best_f1", runs[s]["scores"]["f1"]), -s))
        if seeds else None,
        "warnings": [],
    }
    if mixed := mixed_code_warning([(f"seed {s}", runs[s]) for s in seeds]):
        results["warnings"].append(mixed)
    write_json_atomic(output_dir / SQUAD_RESULTS, results)
    write_text_atomic(output_dir / "squad_results.md", results_markdown(results))
    return results


def model_label(model: str | None) -> str:
    """The model's folder name; with its parent for a compare run's `<run>/seed<k>`."""
    if not model:
        return "?"
    path = Path(model)
    return f"{path.parent.name}/{path.name}" if path.name.startswith("seed") else path.name


def results_markdown(results: dict) -> str:
    version = results["version"]
    model = model_label(results["model"])
    params = f"{results['encoder_params'] / 1e6:.2f}M" if results["encoder_params"] else "–"
    columns = HEADLINE[version]
    threshold_note = (" EM and F1 are the official v2.0 evaluator's best_exact / best_f1: the no-answer threshold "
                      "is chosen on the dev set, per seed, as the official protocol does. HasAns and NoAns split "
                      "the scores of the predictions as written (the evaluator's default threshold), not at that "
                      "chosen threshold." if version == "2.0" else "")
    lines = [
        f"# SQuAD v{version} dev results: {model}",
        "",
        f"Exact match and F1 x 100 of the official SQuAD v{version} evaluation, mean ± standard error of the mean "
        f"over {len(results['seeds'])} fine-tuning seed(s) (layout of Jiang et al. 2020, Table 4).{threshold_note} "
        "Params: encoder without the QA head.",
        "",
        "| Model | Params | " + " | ".join(label for label, _ in columns) + " |",
        "|---|---:|" + "---:|" * len(columns),
        f"| {model} | {params} | " + " | ".join(format_mean_sem(results["scores"].get(key)) for _, key in columns)
        + " |",
        "",
        "## Per seed",
        "",
        "| Seed | " + " | ".join(label for label, _ in columns) + (" | Thresholds (EM, F1)" if version == "2.0" else "")
        + " |",
        "|---:|" + "---:|" * (len(columns) + (version == "2.0")),
    ]
    for seed, scores in results["runs"].items():
        cells = [f"{scores[key]:.1f}" if key in scores else "–" for _, key in columns]
        if version == "2.0":
            cells.append(f"{scores.get('best_exact_thresh', float('nan')):.2f}, "
                         f"{scores.get('best_f1_thresh', float('nan')):.2f}")
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    settings = results["settings"]
    if settings:
        lines += ["", "## Settings", "", "| " + " | ".join(settings) + " |", "|" + "---:|" * len(settings),
                  "| " + " | ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in settings.values()) + " |"]
    if results.get("warnings"):
        lines += ["", "## Warnings", "", *(f"- {warning}" for warning in results["warnings"])]
    return "\n".join(lines) + "\n"
