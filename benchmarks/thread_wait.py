"""What OpenMP's waiting threads cost a CPU training step: sleeping (`OMP_WAIT_POLICY=PASSIVE`) against libgomp's
default (spin a while, then sleep), on a quiet machine and beside busy processes (each a Python loop holding a
core). Each arm is a fresh process (OpenMP reads the policy once, when torch loads) timing the pretraining step of
benchmarks/step_cost.py for a few runs of the position study, taking turns; the arms alternate over --rounds. The
figures: wall seconds per step, and CPU seconds per step per thread (what a time budget's compute clock counts).
Nothing here asserts a time. Results go to benchmarks/results/thread_wait.md and a row to thread_wait.jsonl.

    python benchmarks/thread_wait.py --tokenizer benchmarks/results/compare-positions/tokenizer \\
        --train-file ../shared/data/enwiki-2015-sample/
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness
import step_cost

# arm -> the OpenMP variables it sets (none: libgomp's own default, a spin of 300,000 rounds before sleeping);
# GOMP_SPINCOUNT bounds the spin whatever the policy says
ARMS = {"sleeping": {"OMP_WAIT_POLICY": "PASSIVE"}, "spinning": {},
        "spin-1000": {"GOMP_SPINCOUNT": "1000"}, "spin-3000": {"GOMP_SPINCOUNT": "3000"}}


def child(spec: dict) -> dict:
    """In the arm's own process: each run's median wall and CPU-per-thread seconds per step."""
    import torch

    torch.set_num_threads(spec["threads"])
    batch, length = spec["batch_size"], spec["seq_len"]
    if spec["train_file"]:
        batches, vocab = step_cost.corpus_batches(spec["train_file"], spec["tokenizer"], "pairs", batch, length, 8)
    else:
        vocab = 8000
        batches = step_cost.random_batches(vocab, batch, length)
    steps = {run: step_cost.build(f"chang2021-small/{run}", {**spec["fields"], "vocab_size": vocab}, batches)[0]
             for run in spec["runs"]}
    wall: dict[str, list[float]] = {run: [] for run in steps}
    cpu: dict[str, list[float]] = {run: [] for run in steps}
    for rep in range(2 + spec["reps"]):
        for run, step in steps.items():
            started, used = time.perf_counter(), time.process_time()
            step()
            if rep >= 2:
                wall[run].append(time.perf_counter() - started)
                cpu[run].append((time.process_time() - used) / spec["threads"])
    return {run: {"wall": statistics.median(wall[run]), "cpu_per_thread": statistics.median(cpu[run])}
            for run in steps}


def run_arm(arm: str, busy: int, spec: dict) -> dict:
    env = {name: value for name, value in os.environ.items() if name not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(ARMS[arm])
    load = harness.busy_processes(busy)
    try:
        done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                              text=True, env=env, cwd=Path(__file__).parent)
    finally:
        for process in load:
            process.kill()
    if done.returncode != 0:
        raise SystemExit(f"the {arm} arm failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = harness.arguments(__doc__, reps=12, threads=2, output="thread_wait.md")
    parser.add_argument("--runs", default="absolute,composite+key,convbert", help="position-study runs to time")
    parser.add_argument("--busy", default="0,2", help="busy processes beside each arm, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="times each arm runs (alternating)")
    parser.add_argument("--arms", default="sleeping,spinning,spin-1000", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--train-file")
    parser.add_argument("--tokenizer")
    # the position study's sizes (RESULTS 6.5), which RESULTS 5's figures were measured at
    step_cost.add_size_flags(parser, layers=2, hidden=128, heads=4, intermediate=512)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if bool(args.train_file) != bool(args.tokenizer):
        parser.error("--train-file and --tokenizer go together")
    root = Path.cwd()
    fields = step_cost.size_fields(argparse.Namespace(**vars(args), vocab_size=None))  # the tokenizer's vocabulary
    spec = {"runs": args.runs.split(","), "reps": args.reps, "threads": args.threads, "fields": fields,
            "batch_size": args.batch_size, "seq_len": args.seq_len,
            "train_file": str(root / args.train_file) if args.train_file else None,
            "tokenizer": str(root / args.tokenizer) if args.tokenizer else None}
    loads = [int(x) for x in args.busy.split(",")]
    arms = args.arms.split(",")
    if set(arms) - set(ARMS):
        parser.error(f"--arms: choose from {', '.join(ARMS)}")
    results: dict[tuple[int, str], list[dict]] = {}
    with harness.Run("thread_wait", runs=spec["runs"], reps=args.reps, threads=args.threads,
                     inputs="corpus" if args.train_file else "random") as run:
        for round_ in range(args.rounds):
            for busy in loads:
                for arm in arms:
                    figures = run_arm(arm, busy, spec)
                    results.setdefault((busy, arm), []).append(figures)
                    run.add(round=round_, busy=busy, arm=arm, figures=figures)
                    print(f"round {round_}, {busy} busy, {arm}: "
                          + ", ".join(f"{name} {f['wall'] * 1e3:.0f} ms" for name, f in figures.items()),
                          file=sys.stderr, flush=True)
    lines = harness.heading("OpenMP's waiting threads and a CPU training step", f"Machine: {harness.machine_line()}  ",
                            f"Each cell: wall ms per step / CPU ms per step per thread, the median of {args.reps} "
                            f"steps, then the median over {args.rounds} rounds.", "",
                            "| busy processes | threads wait by | " + " | ".join(spec["runs"]) + " |",
                            "|---:|---|" + "---:|" * len(spec["runs"]))
    for (busy, arm), rounds in results.items():
        cells = []
        for name in spec["runs"]:
            wall = statistics.median(r[name]["wall"] for r in rounds)
            cpu = statistics.median(r[name]["cpu_per_thread"] for r in rounds)
            cells.append(f"{wall * 1e3:,.0f} / {cpu * 1e3:,.0f}")
        lines.append(f"| {busy} | {arm} | " + " | ".join(cells) + " |")
    harness.report(args.output, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
