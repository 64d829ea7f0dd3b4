"""One composite-family attention layer, forward+backward, against the same layer with plain SDPA.

Time: all arms in one process, taking turns within every repetition (median and spread).
Memory: every arm in a fresh process (`--arm`), peak resident memory (VmHWM) and its growth
over the step (peak minus the resident memory after building the layer and inputs).
The layer is CompositeSelfAttention of the chang2021-small presets (H 256, 4 heads, d 64) with
attention dropout 0 (on CPU, SDPA with dropout runs the math kernel for every arm), 1/8 of one
row padded. Results go to benchmarks/results/attention_layer.md.

    python benchmarks/attention_layer.py                          # n = 512 (batch 16), 2048 (batch 4)
    python benchmarks/attention_layer.py --shapes 8192x1 --reps 1  # does a batch of 1 at n = 8192 train
    python benchmarks/attention_layer.py --shapes 512x16 --decomposed-from 100000  # the dense bias instead
    python benchmarks/attention_layer.py --compile --reps 7  # every arm under torch.compile (inductor), time only
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import machine_line, status_bytes, write_atomic

from convattn import ConvAttnConfig
from convattn.attention import TokenMask
from convattn.attention.composite import CompositeSelfAttention
from convattn.attention.relative import dispatch

ARMS = ["none", "composite", "composite+key", "composite+depthwise", "conv-qkv"]


def build(arm: str, n: int, batch: int, dropout: float = 0.0, compiled: bool = False):
    config = ConvAttnConfig.from_preset(f"chang2021-small/{arm}", attention_probs_dropout_prob=dropout,
                                        max_position_embeddings=max(n, 128))
    torch.manual_seed(0)
    layer = CompositeSelfAttention(config).train()
    hidden = torch.randn(batch, n, config.hidden_size, requires_grad=True)
    keep = torch.ones(batch, n, dtype=torch.bool)
    keep[0, n - n // 8:] = False
    mask = TokenMask(keep)
    attend = torch.compile(layer) if compiled else layer

    def step():
        attend(hidden, mask)[0].pow(2).mean().backward()
    return step


def measure_memory(arm: str, n: int, batch: int, dropout: float) -> dict:
    """Run in a fresh process: peak resident memory of its first forward+backward."""
    step = build(arm, n, batch, dropout)
    before = status_bytes("VmRSS")
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    peak = status_bytes("VmHWM")
    return {"arm": arm, "peak": peak, "growth": peak - before, "seconds": seconds}


def time_arms(n: int, batch: int, reps: int, dropout: float, compiled: bool) -> dict[str, list[float]]:
    steps = {arm: build(arm, n, batch, dropout, compiled) for arm in ARMS}
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for rep in range(reps + 1):
        for arm, step in steps.items():
            start = time.perf_counter()
            step()
            if rep:
                times[arm].append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="512x16,2048x4", help="n x batch, comma-separated")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decomposed-from", type=int,
                        help="override dispatch.CPU_DECOMPOSED_MIN_LENGTH and CPU_BLOCKWISE_MIN_LENGTH (tokens)")
    parser.add_argument("--attention-dropout", type=float, default=0.0,
                        help="dropout on the probabilities (relative terms then run blockwise from "
                             "dispatch.CPU_BLOCKWISE_MIN_LENGTH tokens on, the dense bias below)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each layer (inductor); the first step compiles and is not timed, and "
                             "memory is not measured")
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "attention_layer.md")
    args = parser.parse_args()
    if args.compile and not args.reps:
        parser.error("--compile measures time only: give --reps 1 or more")
    torch._dynamo.config.recompile_limit = 64  # every arm and shape compiles the same forward functions anew
    torch.set_num_threads(args.threads)
    if args.decomposed_from is not None:
        dispatch.CPU_DECOMPOSED_MIN_LENGTH = dispatch.CPU_BLOCKWISE_MIN_LENGTH = args.decomposed_from
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    if args.arm:
        print(json.dumps(measure_memory(args.arm, *shapes[0], args.attention_dropout)))
        return 0

    lines = [
        "# One attention layer, forward+backward, vs the same layer with plain SDPA", "",
        f"Command: `python benchmarks/attention_layer.py {' '.join(sys.argv[1:])}`".rstrip() + "  ",
        f"Machine: {machine_line()} (a shared VM: ratios move by about 0.1 between runs). "
        "CompositeSelfAttention of chang2021-small (H 256, 4 heads, d 64), "
        f"attention dropout {args.attention_dropout}, 1/8 of one row padded. Time: median over reps "
        "[min, max] of all arms taking turns in one process, ratio to `none` (plain SDPA, no bias). "
        "Memory: a fresh process per arm; peak RSS, and its growth during the step (peak minus RSS "
        "after building layer and inputs), ratio of growth to `none`. Relative terms take the decomposed path "
        f"from n = {dispatch.CPU_DECOMPOSED_MIN_LENGTH} on (blockwise with dropout from "
        f"{dispatch.CPU_BLOCKWISE_MIN_LENGTH}), the dense bias below."
        + (" Every layer under torch.compile (inductor), memory not measured." if args.compile else ""), "",
        "| n | batch | arm | ms median [min, max] | time ratio | peak RSS MiB | step growth MiB | growth ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, batch in shapes:
        times = time_arms(n, batch, args.reps, args.attention_dropout, args.compile) if args.reps else {}
        memory = {}  # none under --compile
        for arm in [] if args.compile else ARMS:
            command = [sys.executable, __file__, "--arm", arm, "--shapes", f"{n}x{batch}",
                       "--threads", str(args.threads), "--attention-dropout", str(args.attention_dropout)]
            if args.decomposed_from is not None:
                command += ["--decomposed-from", str(args.decomposed_from)]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            memory[arm] = json.loads(out.stdout.strip().splitlines()[-1])
        for arm in ARMS:
            mem = memory.get(arm)
            if times:
                median, base = statistics.median(times[arm]), statistics.median(times["none"])
                time_cells = (f"{median * 1e3:.0f} [{min(times[arm]) * 1e3:.0f}, {max(times[arm]) * 1e3:.0f}]",
                              f"{median / base:.2f}")
            else:
                time_cells = (f"{mem['seconds'] * 1e3:.0f} (one step)", "-")
            memory_cells = ("-", "-", "-") if mem is None else (
                f"{mem['peak'] / 2**20:.0f}", f"{mem['growth'] / 2**20:.0f}",
                f"{mem['growth'] / memory['none']['growth']:.2f}")
            row = f"| {n} | {batch} | {arm} | {' | '.join(time_cells)} | {' | '.join(memory_cells)} |"
            lines.append(row)
            print(row, flush=True)
    write_atomic(args.output, "\n".join(lines) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
