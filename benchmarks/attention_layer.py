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
    python benchmarks/attention_layer.py --arms none,rotary,alibi,composite,composite+rotary  # today's positions
    python benchmarks/attention_layer.py --arms none,rotary,rotary-halves  # what rotary's pair order saves
    python benchmarks/attention_layer.py --arms none,alibi,alibi-decomposed  # ALiBi's Toeplitz view, and before
    python benchmarks/attention_layer.py --shapes 128x64,256x32 --arms none,alibi-dense,alibi-toeplitz  # from where
"""

from __future__ import annotations

import contextlib
import sys
from unittest import mock

import harness
import torch

from convattn import ConvAttnConfig
from convattn.attention import TokenMask, rotary
from convattn.attention.composite import CompositeSelfAttention
from convattn.attention.relative import dispatch

ARMS = ["none", "composite", "composite+key", "composite+depthwise", "conv-qkv"]


# arms that are a preset's layer computed another way, each with the context that switches it: the rotate-half
# formula in place of the pair order; ALiBi through the decomposition (its CPU path before toeplitz.py)
VARIANTS = {"rotary-halves": ("rotary", lambda: mock.patch.object(rotary, "PAIR_ORDER", False)),
            "alibi-decomposed": ("alibi", lambda: dispatch.forced_path("decomposed")),
            "alibi-toeplitz": ("alibi", lambda: dispatch.forced_path("toeplitz")),
            "alibi-dense": ("alibi", lambda: dispatch.forced_path("dense"))}


def build(arm: str, n: int, batch: int, dropout: float = 0.0, compiled: bool = False):
    preset, switched = VARIANTS.get(arm, (arm, contextlib.nullcontext))
    config = ConvAttnConfig.from_preset(f"chang2021-small/{preset}", attention_probs_dropout_prob=dropout,
                                        max_position_embeddings=max(n, 128))
    torch.manual_seed(0)
    layer = CompositeSelfAttention(config).train()
    hidden = torch.randn(batch, n, config.hidden_size, requires_grad=True)
    mask = TokenMask(harness.padded_keep(batch, n))
    attend = torch.compile(layer) if compiled else layer

    def step():
        with switched():
            attend(hidden, mask)[0].pow(2).mean().backward()
    return step


def main() -> int:
    parser = harness.arguments(__doc__, shapes="512x16,2048x4", reps=5, threads=2, output="attention_layer.md",
                               arm=True)
    parser.add_argument("--decomposed-from", type=int,
                        help="override dispatch.CPU_DECOMPOSED_MIN_LENGTH and CPU_BLOCKWISE_MIN_LENGTH (tokens)")
    parser.add_argument("--attention-dropout", type=float, default=0.0,
                        help="dropout on the probabilities (relative terms then run blockwise from "
                             "dispatch.CPU_BLOCKWISE_MIN_LENGTH tokens on, the dense bias below)")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help="chang2021-small presets' layers to time, comma-separated, or "
                             f"{', '.join(VARIANTS)}; `none` (plain SDPA) first, the baseline of every ratio "
                             "(default: %(default)s)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each layer (inductor); the first step compiles and is not timed, and "
                             "memory is not measured")
    args = parser.parse_args()
    if args.compile and not args.reps:
        parser.error("--compile measures time only: give --reps 1 or more")
    torch._dynamo.config.recompile_limit = 64  # every arm and shape compiles the same forward functions anew
    torch.set_num_threads(args.threads)
    if args.decomposed_from is not None:
        dispatch.CPU_DECOMPOSED_MIN_LENGTH = dispatch.CPU_BLOCKWISE_MIN_LENGTH = args.decomposed_from
    shapes = harness.shapes(args.shapes)
    arms = args.arms.split(",")
    if arms[0] != "none":
        parser.error(f"--arms must start with none, the baseline of every ratio; got {args.arms}")
    if args.arm:
        return harness.measure_arm(args.arm, build, *shapes[0], args.attention_dropout)

    about = (
        f"Machine: {harness.machine_line()} (a shared VM: ratios move by about 0.1 between runs). "
        "CompositeSelfAttention of chang2021-small (H 256, 4 heads, d 64), "
        f"attention dropout {args.attention_dropout}, 1/8 of one row padded. Time: median over reps "
        "[min, max] of all arms taking turns in one process, ratio to `none` (plain SDPA, no bias). "
        "Memory: a fresh process per arm; peak RSS, and its growth during the step (peak minus RSS "
        "after building layer and inputs), ratio of growth to `none`. Relative terms take the decomposed path "
        f"from n = {dispatch.CPU_DECOMPOSED_MIN_LENGTH} on (blockwise with dropout from "
        f"{dispatch.CPU_BLOCKWISE_MIN_LENGTH}), the dense bias below; ALiBi alone without dropout the Toeplitz "
        f"view from n = {dispatch.CPU_DECOMPOSED_MIN_LENGTH} on."
        + (" Every layer under torch.compile (inductor), memory not measured." if args.compile else ""))
    lines = [
        *harness.heading("One attention layer, forward+backward, vs the same layer with plain SDPA", about), "",
        "| n | batch | arm | ms median [min, max] | time ratio | peak RSS MiB | step growth MiB | growth ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    child = ["--threads", str(args.threads), "--attention-dropout", str(args.attention_dropout)]
    if args.decomposed_from is not None:
        child += ["--decomposed-from", str(args.decomposed_from)]
    with harness.Run("attention_layer", dropout=args.attention_dropout, compiled=args.compile) as run:
        for n, batch in shapes:
            times = harness.spreads({arm: build(arm, n, batch, args.attention_dropout, args.compile) for arm in arms},
                                    args.reps) if args.reps else {}
            memory = {} if args.compile else harness.fresh_processes(  # a fresh process per arm; none compiled
                __file__, arms, ["--shapes", f"{n}x{batch}", *child])
            for arm in arms:
                mem, spread = memory.get(arm), times.get(arm)
                figure = run.add(n=n, batch=batch, arm=arm)
                if spread:
                    ratio = spread.median / times["none"].median
                    figure.update(ms=spread.figure(), time_ratio=round(ratio, 3))
                    time_cells = (spread.ms(), f"{ratio:.2f}")
                else:
                    time_cells = (f"{mem['seconds'] * 1e3:.0f} (one step)", "-")
                memory_cells = ("-", "-", "-")
                if mem is not None:
                    growth = mem["growth"] / memory["none"]["growth"]
                    figure.update(peak_mib=round(mem["peak"] / 2**20, 1), growth_mib=round(mem["growth"] / 2**20, 1),
                                  growth_ratio=round(growth, 3))
                    memory_cells = (f"{mem['peak'] / 2**20:.0f}", f"{mem['growth'] / 2**20:.0f}", f"{growth:.2f}")
                harness.emit(lines, n, batch, arm, *time_cells, *memory_cells)
    return harness.report(args.output, lines)


if __name__ == "__main__":
    sys.exit(main())
