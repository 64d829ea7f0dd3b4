"""Does `--time-budget` measure the model or the machine? The same `convattn pretrain` time-budget run, alone and
beside busy processes (each a Python loop holding a core), on the compute clock (the default) and on the wall
clock, and on the compute clock with OpenMP's threads spinning while they wait (libgomp's default, which the
command line replaces with sleeping). Each arm is a fresh run in its own folder; the figure is the steps the
budget bought, as a ratio to the same clock's run alone. Nothing here asserts a time. Rows are appended to
benchmarks/results/budget_clock.jsonl (command, commit, machine, figures); RESULTS.md presents them.

    python benchmarks/budget_clock.py                     # 25 s budgets, two busy processes
    python benchmarks/budget_clock.py --budget 10s --busy 1 --arms compute,wall
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import harness

# the run of issue 66's report: 2 layers, hidden 128, batch 16 x 128 on the embedded corpus (its evaluations, which
# the budget does not count, on 64 examples)
RUN = ["--layers", "2", "--hidden", "128", "--batch-size", "16", "--seq-len", "128", "--eval-samples", "64"]
# arm -> (the budget's clock, environment added): "spinning" keeps libgomp's own default spin count (300,000)
ARMS = {"compute": ("compute", {}), "wall": ("wall", {}), "spinning": ("compute", {"GOMP_SPINCOUNT": "300000"})}


def run_arm(arm: str, budget: str, busy: int, folder: Path) -> dict:
    clock, env = ARMS[arm]
    out = folder / f"{arm}-busy{busy}"
    load = harness.busy_processes(busy)
    started = time.perf_counter()
    try:
        harness.convattn(["pretrain", *RUN, "--time-budget", budget, "--budget-clock", clock, "--output-dir", str(out)],
                         env)
    finally:
        for process in load:
            process.kill()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    slowed = [row["slowed_steps"] for row in rows if row.get("slowed_steps") is not None]
    return {"arm": arm, "clock": clock, "busy": busy, "steps": last["step"],
            "training_compute_seconds": last["training_compute_seconds"],
            "training_wall_seconds": last["training_wall_seconds"],
            "slowed_steps": round(sum(slowed) / len(slowed), 3) if slowed else None,
            "run_seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="25s", help="each run's --time-budget")
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the loaded runs")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--output", type=Path, help="the rows' file (default: benchmarks/results/budget_clock.jsonl)")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        parser.error(f"--arms: unknown {', '.join(sorted(unknown))}; choose from {', '.join(ARMS)}")
    run = harness.Run("budget_clock", path=args.output, budget=args.budget)
    with run, tempfile.TemporaryDirectory() as folder:
        harness.convattn(["pretrain", *RUN, "--max-steps", "1", "--output-dir", str(Path(folder) / "warm")])  # cache
        for arm in arms:
            alone = run_arm(arm, args.budget, 0, Path(folder))
            loaded = run_arm(arm, args.budget, args.busy, Path(folder))
            loaded["steps_vs_alone"] = round(loaded["steps"] / alone["steps"], 3)
            run.figures += [alone, loaded]
            print(json.dumps(alone), json.dumps(loaded), sep="\n", flush=True)
        run.machine = harness.machine_line(threads=False)  # the runs' own processes set their threads


if __name__ == "__main__":
    main()
