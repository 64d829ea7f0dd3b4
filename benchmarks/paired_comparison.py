"""Paired per-seed comparison of `convattn compare` runs (the reproduction tables of RESULTS.md section 6).

Seed k gives every run the same initialisation seed, data order and masks, so the difference between two
runs at the same seed and step is a paired measurement: its sign over seeds says more than two overlapping
mean ± SEM intervals. Reads OUTPUT_DIR/metrics.csv of a compare run and writes, next to it (or --out):

- paired.md: final perplexity per run (mean ± SEM and per seed); for each pair "A - B" the per-seed
  differences, their mean ± SEM, how many seeds agree on the sign, and the first evaluated step from which
  every later evaluation has every seed agreeing on that sign (the budget at which the ordering appears);
- paired.png: each pair's mean difference vs step with its SEM band.

With --costs (benchmarks/step_cost.py's .json: each run's seconds per training step, measured in one process) the
table also reads at equal cost: every run's cost per step beside its perplexity, and each run's curves read where
it has spent what the cheapest run spends in all its steps (fewer steps for a dearer run), with the pairs' paired
differences there. A dearer run's learning rate has not finished decaying at that step, so its perplexity there
is worse than a run planned for that many steps would reach: at equal cost the dearer run is read pessimistically.

    python benchmarks/paired_comparison.py runs/repro16 \
        --pairs composite:none composite:absolute fixed:none dynamic:fixed
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import harness


def load_curves(metrics_csv: Path) -> dict[str, dict[int, dict[int, float]]]:
    """run -> seed -> step -> eval perplexity."""
    curves: dict[str, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    with metrics_csv.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["perplexity"]:
                curves[row["run"]][int(row["seed"])][int(row["step"])] = float(row["perplexity"])
    return curves


def short_name(run: str) -> str:
    return run.split("/")[-1]


def mean_sem(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    sem = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return mean, sem


def paired_differences(a: dict[int, dict[int, float]], b: dict[int, dict[int, float]]) -> dict[int, dict[int, float]]:
    """step -> seed -> a - b, over the seeds and steps both runs have."""
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for seed in sorted(set(a) & set(b)):
        for step in sorted(set(a[seed]) & set(b[seed])):
            out[step][seed] = a[seed][step] - b[seed][step]
    return out


def ordering_onset(diffs: dict[int, dict[int, float]], sign: float, seeds: int) -> int | None:
    """First step from which every later evaluation has all `seeds` seeds on `sign`'s side of zero."""
    onset = None
    for step in sorted(s for s in diffs if s > 0):  # step 0 is the initialisation, before any training
        values = diffs[step]
        agree = len(values) == seeds and all(v * sign > 0 for v in values.values())
        if agree and onset is None:
            onset = step
        elif not agree:
            onset = None
    return onset


def read_costs(measured: dict) -> dict[str, float]:
    """run name (after the preset family's '/') -> seconds per training step, from step_cost.py's .json, parsed."""
    return {name: cost["seconds_per_step"] for name, cost in measured["costs"].items()}


def at_step(curve: dict[int, float], step: float) -> float:
    """A seed's eval perplexity at `step` (between its first and last evaluation), linear in log perplexity between
    the evaluations either side."""
    steps = sorted(curve)
    if not steps[0] <= step <= steps[-1]:
        raise ValueError(f"step {step:g} is outside the evaluated steps {steps[0]}..{steps[-1]}")
    after = next(s for s in steps if s >= step)
    if after == step:
        return curve[after]
    before = max(s for s in steps if s < step)
    share = (step - before) / (after - before)
    return math.exp((1 - share) * math.log(curve[before]) + share * math.log(curve[after]))


def equal_cost_steps(curves, costs: dict[str, float]) -> dict[str, float]:
    """run (short name) -> the step at which it has spent what the cheapest costed run spends over all its steps
    (every run's last step is the one all its seeds reach)."""
    last = {short_name(run): min(max(steps) for steps in seeds.values()) for run, seeds in curves.items()}
    costed = {name: cost for name, cost in costs.items() if name in last}
    budget = min(cost * last[name] for name, cost in costed.items())
    return {name: min(last[name], budget / cost) for name, cost in costed.items()}


def equal_cost_lines(curves, pairs: list[tuple[str, str]], costs: dict[str, float], baseline: str,
                     run: harness.Run, cost_source: str = "the cost file") -> list[str]:
    by_short = {short_name(name): name for name in curves}
    steps = equal_cost_steps(curves, costs)
    cheapest = min(steps, key=lambda name: costs[name])
    lines = ["", "## At equal cost", "",
             f"Each run's curves read at the step where it has spent what `{cheapest}`, the cheapest, spends in "
             f"{steps[cheapest]:,.0f} steps (seconds per step from {cost_source}, x `{baseline}`'s). The dearer a "
             "run, the earlier it is read, before its learning rate has decayed: pessimistic for the dearer runs.",
             "", "| Run | Cost per step | Step read | Mean ± SEM | Per seed |", "|---|---:|---:|---:|---|"]
    base = costs.get(baseline, costs[cheapest])
    read: dict[str, dict[int, float]] = {}
    for name, step in steps.items():
        read[name] = {seed: at_step(curve, step) for seed, curve in sorted(curves[by_short[name]].items())}
        mean, sem = mean_sem(list(read[name].values()))
        run.add(equal_cost_run=name, cost_ratio=costs[name] / base, step=step, perplexity=read[name], mean=mean,
                sem=number(sem))
        lines.append(f"| {name} | {costs[name] / base:.2f}x | {step:,.0f} | {fmt(mean)} ± {fmt(sem)} | "
                     + ", ".join(f"{v:,.1f}" for v in read[name].values()) + " |")
    lines += ["", "| A - B at equal cost | Per seed | Mean ± SEM | Seeds agreeing |", "|---|---|---:|---:|"]
    for a, b in pairs:
        if a not in read or b not in read:
            continue
        seeds = sorted(set(read[a]) & set(read[b]))
        values = [read[a][seed] - read[b][seed] for seed in seeds]
        if not values:
            continue
        mean, sem = mean_sem(values)
        agree = agreeing(values, mean)
        run.add(equal_cost_pair=f"{a} - {b}", differences=dict(zip(seeds, values, strict=True)), mean=mean,
                sem=number(sem), agreeing=agree)
        lines.append(f"| {a} - {b} | {', '.join(f'{v:+,.1f}' for v in values)} | {mean:+,.1f} ± {fmt(sem)} | "
                     f"{agree}/{len(values)} |")
    return lines


def agreeing(values: list[float], mean: float) -> int:
    """How many seeds' differences have their mean's sign."""
    sign = -1.0 if mean < 0 else 1.0
    return sum(v * sign > 0 for v in values)


def number(x: float) -> float | None:
    """x, or None for NaN (a row's JSON has no NaN)."""
    return None if math.isnan(x) else x


def fmt(x: float, digits: int = 1) -> str:
    return "n/a" if math.isnan(x) else f"{x:,.{digits}f}"


def report(curves, pairs: list[tuple[str, str]], source: Path, run: harness.Run,
           costs: dict[str, float] | None = None, baseline: str = "absolute",
           cost_source: str = "the cost file") -> str:
    by_short = {short_name(name): name for name in curves}
    lines = [f"# Paired comparison: `{source}`", ""]
    lines += ["## Final eval perplexity", "", "| Run | Seeds | Mean ± SEM | Per seed | Last step |",
              "|---|---:|---:|---|---:|"]
    for run_name, seeds in curves.items():
        finals = {s: steps[max(steps)] for s, steps in sorted(seeds.items())}
        last = min(max(steps) for steps in seeds.values())
        mean, sem = mean_sem(list(finals.values()))
        per_seed = ", ".join(f"{v:,.1f}" for v in finals.values())
        run.add(run=short_name(run_name), seeds=len(finals), perplexity=finals, mean=mean, sem=number(sem),
                last_step=last)
        lines.append(f"| {short_name(run_name)} | {len(finals)} | {fmt(mean)} ± {fmt(sem)} | {per_seed} | {last:,} |")
    lines += ["", "## Paired differences (same seed = same initialisation, data order and masks)", "",
              "Negative: the first run has the lower (better) perplexity. Onset: the first evaluated step from "
              "which every later evaluation has every seed on the final sign (step 0, the initialisation, "
              "left out).", "",
              "| A - B | Step | Per seed | Mean ± SEM | Seeds agreeing | Onset |", "|---|---:|---|---:|---:|---:|"]
    for a, b in pairs:
        diffs = paired_differences(curves[by_short[a]], curves[by_short[b]])
        if not diffs:
            continue
        seeds = max(len(v) for v in diffs.values())
        step = max(s for s, v in diffs.items() if len(v) == seeds)
        values = list(diffs[step].values())
        mean, sem = mean_sem(values)
        sign = -1.0 if mean < 0 else 1.0
        agree = agreeing(values, mean)
        onset = ordering_onset(diffs, sign, seeds)
        per_seed = ", ".join(f"{v:+,.1f}" for v in values)
        run.add(pair=f"{a} - {b}", step=step, differences=dict(diffs[step]), mean=mean, sem=number(sem), agreeing=agree,
                onset=onset)
        lines.append(f"| {a} - {b} | {step:,} | {per_seed} | {mean:+,.1f} ± {fmt(sem)} | {agree}/{len(values)} | "
                     f"{'never' if onset is None else f'{onset:,}'} |")
    if costs:
        lines += equal_cost_lines(curves, pairs, costs, baseline, run, cost_source)
    return "\n".join(lines) + "\n"


def plot(curves, pairs: list[tuple[str, str]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_short = {short_name(run): run for run in curves}
    fig, ax = plt.subplots(figsize=(7, 4))
    for a, b in pairs:
        diffs = paired_differences(curves[by_short[a]], curves[by_short[b]])
        steps = [s for s in sorted(diffs) if s > 0 and len(diffs[s]) >= 2]
        if not steps:
            continue
        stats = [mean_sem(list(diffs[s].values())) for s in steps]
        means = [m for m, _ in stats]
        ax.plot(steps, means, label=f"{a} - {b}")
        ax.fill_between(steps, [m - e for m, e in stats], [m + e for m, e in stats], alpha=0.2)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("training step")
    ax.set_ylabel("eval perplexity difference (mean ± SEM over seeds)")
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("compare_dir", type=Path, help="a `convattn compare` output directory (has metrics.csv)")
    parser.add_argument("--pairs", nargs="+", default=["composite:none", "composite:absolute", "fixed:none",
                                                        "dynamic:fixed"],
                        help="A:B pairs of run names (the part after the preset family's '/'); reports A - B")
    parser.add_argument("--out", type=Path, help="where paired.md and paired.png go (default: compare_dir)")
    parser.add_argument("--costs", type=Path,
                        help="benchmarks/step_cost.py's .json of the same runs: adds the table at equal cost")
    args = parser.parse_args()
    curves = load_curves(args.compare_dir / "metrics.csv")
    if any(p.count(":") != 1 for p in args.pairs):
        parser.error(f"--pairs: each pair is A:B, got {' '.join(args.pairs)}")
    pairs = [tuple(p.split(":")) for p in args.pairs]
    unknown = {name for pair in pairs for name in pair} - {short_name(run) for run in curves}
    if unknown:
        parser.error(f"--pairs: no run named {', '.join(sorted(unknown))} in {args.compare_dir}/metrics.csv")
    costs, baseline, cost_source = None, "absolute", "the cost file"
    if args.costs:
        try:
            measured = json.loads(args.costs.read_text())
            baseline = measured["baseline"]
            costs = read_costs(measured)
            # which measurement the table rests on: a cost file measured again changes it
            cost_source = (f"`{args.costs}`, commit {measured.get('commit', 'unknown')}: "
                           f"`{measured.get('command', '?')}`")
        except (OSError, ValueError, KeyError) as err:
            parser.error(f"--costs {args.costs}: not benchmarks/step_cost.py's .json ({err})")
        if not set(costs) & {short_name(run) for run in curves}:
            parser.error(f"--costs {args.costs}: none of its runs ({', '.join(costs)}) is in {args.compare_dir}")
    out = args.out or args.compare_dir
    out.mkdir(parents=True, exist_ok=True)
    with harness.Run("paired_comparison", machine="-", source=str(args.compare_dir)) as run:
        text = report(curves, pairs, args.compare_dir, run, costs, baseline, cost_source)
    harness.report(out / "paired.md", text, quiet=True)
    plot(curves, pairs, out / "paired.png")
    print(text)


if __name__ == "__main__":
    main()
