"""Scaling of full attention vs Linformer vs Conv-Linformer: forward+backward time and memory vs n.

The Conv-Linformer paper's setup (malard/* presets: H 512, 8 heads, I 2048), scaled to each n with
`max_position_embeddings=n`: one encoder layer and the 8-layer encoder (hidden states in, no
embeddings or MLM head, so the vocabulary does not dominate), for
  full            malard/transformer-n*        plain SDPA softmax attention over all n keys
  linformer       malard/linformer-n*-k{K}     E/F (k x n) in all 8 layers, headwise sharing
  conv-linformer  malard/conv-linformer-n*-k{K} 4 layers E/F + 4 layers dense strided Conv1d
at n = 512 ... 8192 and k = 128, 256. Every (level, model, n) runs in a fresh subprocess, one at a
time, so its peak resident memory is its own. Results: benchmarks/results/linear_attention.{md,png}.

    python benchmarks/linear_attention.py            # the full grid (about 20 min on 2 cores)
    python benchmarks/linear_attention.py --quick    # n = 512, 1024, layer only, one rep (smoke run)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness
import psutil
import torch

from convattn.training.compare.memory import saved_activation_bytes

MODELS = {"full": "malard/transformer-n512", "linformer": "malard/linformer-n512-k{k}",
          "conv-linformer": "malard/conv-linformer-n512-k{k}"}
LINFORMER_PAPER = ("Linformer paper (V100, inference, layerwise sharing, k = 128, n = 4096): "
                   "3.4x faster, 14x less memory")


# ---------------------------------------------------------------------------- one measurement (child)
def measure(level: str, model: str, n: int, k: int, batch: int, reps: int, threads: int) -> dict:
    from convattn import ConvAttnConfig, ConvAttnModel
    from convattn.attention import TokenMask

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    overrides = dict(max_position_embeddings=n, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if model != "full":
        overrides["linformer_k"] = k
    config = ConvAttnConfig.from_preset(MODELS[model].format(k=k), **overrides)
    encoder = ConvAttnModel(config).encoder.train()
    module = encoder.layer[-1] if level == "layer" else encoder  # the last layer is the conv one
    hidden = torch.randn(batch, n, config.hidden_size, requires_grad=True)
    mask = TokenMask(torch.ones(batch, n, dtype=torch.bool))

    def forward() -> torch.Tensor:
        out = module(hidden, mask)
        return out[0] if isinstance(out, tuple) else out.last_hidden_state

    def step() -> None:
        forward().pow(2).mean().backward()

    # a 16-token step loads the kernels and thread pools, so the baseline excludes their one-off memory;
    # dropping the gradients it made keeps them inside the measured peak
    tiny = module(hidden[:, :16].detach().requires_grad_(), TokenMask(mask.keep[:, :16]))
    (tiny[0] if isinstance(tiny, tuple) else tiny.last_hidden_state).sum().backward()
    module.zero_grad(set_to_none=True)
    baseline = psutil.Process().memory_info().rss
    step()  # warm-up
    times, cpu_times = [], []
    for _ in range(reps):
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    saved = saved_activation_bytes(forward) if level == "layer" else 0  # the encoder's is 8 layers' worth
    return dict(level=level, model=model, n=n, k=k, batch=batch, seconds=statistics.median(times),
                seconds_min=min(times), cpu_seconds=statistics.median(cpu_times), peak_bytes=peak - baseline,
                saved_bytes=saved, params=sum(p.numel() for p in module.parameters()))


# ---------------------------------------------------------------------------- the grid (parent)
def run_child(level: str, model: str, n: int, k: int, args) -> dict:
    reps = args.reps if level == "layer" else args.encoder_reps
    spec = json.dumps(dict(level=level, model=model, n=n, k=k, batch=args.batch, reps=reps,
                           threads=args.threads))
    # waiting OpenMP threads sleep instead of spinning, so CPU time counts work, not waiting for a core
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True, check=True,
                          env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratio(rows: list[dict], level: str, model: str, n: int, k: int, key: str) -> float:
    full = find(rows, level, "full", n, None)
    other = find(rows, level, model, n, k)
    return full[key] / other[key] if full and other and other[key] else math.nan


def find(rows: list[dict], level: str, model: str, n: int, k: int | None) -> dict | None:
    for r in rows:
        if r["level"] == level and r["model"] == model and r["n"] == n and (k is None or r["k"] == k):
            return r
    return None


def crossover(rows: list[dict], level: str, model: str, k: int, lengths: list[int], key: str) -> str:
    """The length where `model` becomes faster than full attention, interpolated in log-log between
    the grid points that bracket it."""
    speedups = [(n, ratio(rows, level, model, n, k, key)) for n in lengths]
    speedups = [(n, s) for n, s in speedups if not math.isnan(s)]
    if not speedups:
        return "n/a"
    if speedups[0][1] >= 1:
        return f"<= {speedups[0][0]} (faster at every n measured)"
    for (n0, s0), (n1, s1) in itertools.pairwise(speedups):
        if s0 < 1 <= s1:
            t = math.log(1 / s0) / math.log(s1 / s0)
            return f"~{round(n0 * (n1 / n0) ** t)} (between {n0} and {n1})"
    return f"> {speedups[-1][0]} (slower at every n measured)"


def growth(rows: list[dict], level: str, model: str, k: int, n: int, key: str) -> float:
    small, large = find(rows, level, model, n, k if model != "full" else None), \
        find(rows, level, model, 2 * n, k if model != "full" else None)
    return large[key] / small[key] if small and large else math.nan


def series(rows, level, k_values):
    yield "full", None, [r for r in rows if r["level"] == level and r["model"] == "full"]
    for model in ("linformer", "conv-linformer"):
        for k in k_values:
            yield model, k, [r for r in rows if r["level"] == level and r["model"] == model and r["k"] == k]


def plot(rows: list[dict], levels: list[str], k_values: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(levels), 2, figsize=(11, 4.2 * len(levels)), squeeze=False)
    styles = {"full": "k-o", "linformer": "-s", "conv-linformer": "--^"}
    for row_axes, level in zip(axes, levels, strict=True):
        for model, k, points in series(rows, level, k_values):
            if not points:
                continue
            label = model if k is None else f"{model} k={k}"
            ns = [p["n"] for p in points]
            row_axes[0].plot(ns, [p["cpu_seconds"] * 1e3 for p in points], styles[model], label=label)
            row_axes[1].plot(ns, [p["peak_bytes"] / 2**20 for p in points], styles[model], label=label)
        for ax, what in zip(row_axes, ("forward+backward CPU time (ms)", "peak memory above the model (MiB)"),
                            strict=True):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length n")
            ax.set_ylabel(what)
            ax.set_title(f"{'one layer' if level == 'layer' else '8-layer encoder'}: {what.split(' (')[0]}")
            ax.grid(True, which="both", alpha=0.3)
        row_axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def summary(rows: list[dict], levels: list[str], k_values: list[int], lengths: list[int]) -> list[str]:
    """The headline numbers, from CPU time (the measure least disturbed by other jobs on the cores)."""
    level = "encoder" if "encoder" in levels else levels[0]
    k, n = k_values[0], 4096 if 4096 in lengths else lengths[-1]
    doublings = [m for m in lengths[:-1] if m >= 2048] or lengths[:-1]

    def grow(model: str, kk: int | None) -> str:
        return ", ".join(f"{growth(rows, level, model, kk, m, 'cpu_seconds'):.2f}" for m in doublings)

    return [
        "## Reading (CPU time, 8-layer encoder unless stated)" if level == "encoder" else "## Reading (CPU time)",
        "",
        f"- n = {n}, k = {k}: Linformer is {ratio(rows, level, 'linformer', n, k, 'cpu_seconds'):.2f}x faster "
        f"than full attention with {ratio(rows, level, 'linformer', n, k, 'peak_bytes'):.2f}x less peak memory; "
        f"Conv-Linformer is {ratio(rows, level, 'conv-linformer', n, k, 'cpu_seconds'):.2f}x faster with a "
        f"peak-memory ratio of {ratio(rows, level, 'conv-linformer', n, k, 'peak_bytes'):.2f} (< 1: more memory).",
        f"- Time growth per doubling from n = {doublings[0]}: full attention {grow('full', None)}; "
        + "; ".join(f"Linformer k={kk} {grow('linformer', kk)}" for kk in k_values) + ".",
        "- Crossover (Linformer becomes faster than full attention): "
        + "; ".join(f"k={kk}: {crossover(rows, level, 'linformer', kk, lengths, 'cpu_seconds')}" for kk in k_values)
        + ". Full attention's time grows less than 4x per doubling at small n because the O(n H^2) "
        "projections and feed-forward dominate until n is a few times H; its growth approaches 4x at the top of "
        "the range.",
        "- Memory: plain SDPA on CPU never materialises the n x n matrix, so full attention's memory is already "
        "linear in n and Linformer saves little memory; the dense Conv-Linformer convolution (H x H x n/k "
        "weights per projection) costs more memory than full attention.",
        "",
    ]


def report(rows: list[dict], args, levels: list[str], lengths: list[int], k_values: list[int], minutes: float,
           command: str) -> str:
    mib = 2**20
    lines = [
        "# Linear attention scaling: full attention vs Linformer vs Conv-Linformer",
        "",
        f"Command: `{command}`  ",
        f"Machine: {harness.machine_line(threads=args.threads)}; "
        f"the 2 cores were shared with other jobs while this ran, so absolute times are noisy (ratios less so). "
        f"Total benchmark time: {minutes:.1f} min.",
        "",
        f"Setup: the malard/* presets (H 512, 8 heads, d 64, I 2048) with max_position_embeddings = n; batch "
        f"{args.batch} sequence(s) of n tokens, no padding, dropout 0 (so full attention takes the fused SDPA "
        f"kernel); forward + backward of mean(out^2); median of {args.reps} (layer) / {args.encoder_reps} "
        "(encoder) reps after one warm-up step; float32. Wall = elapsed time; CPU = process CPU time (both "
        "threads, waiting OpenMP threads sleep): it counts the work done and is much less disturbed by other "
        "jobs taking the cores than wall time. 'layer' = "
        "the last encoder layer (for Conv-Linformer "
        "the conv one), 'encoder' = all 8 layers fed hidden states (no embeddings or MLM head). Every "
        "(level, model, n) ran alone in a fresh subprocess.",
        "",
        "Memory: **peak** = peak resident set size of that subprocess (`ru_maxrss`) minus its RSS after the "
        "model and inputs were built and a 16-token step had loaded the kernels: everything one training step "
        "adds (activations, parameter gradients, kernel workspaces, allocator slack). **saved** = bytes "
        "autograd keeps for backward (exact, deterministic; `saved_activation_bytes`). params = "
        "parameters of the measured module (the dense Conv-Linformer convolution has H x H x n/k weights, so "
        "it grows with n). Time and memory ratios are full / model (> 1: the model is faster / smaller).",
        "",
    ]
    for level in levels:
        lines += [f"## {'One layer' if level == 'layer' else '8-layer encoder'}", "",
                  "| n | model | k | params | wall ms (median) | speedup vs full | CPU ms (median) | speedup (CPU) "
                  "| peak MiB | peak ratio | saved MiB | saved ratio |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for n in lengths:
            for model, k, points in series(rows, level, k_values):
                r = next((p for p in points if p["n"] == n), None)
                if r is None:
                    continue
                speed = ratio(rows, level, model, n, k, "seconds") if k else 1.0
                speed_cpu = ratio(rows, level, model, n, k, "cpu_seconds") if k else 1.0
                peak = ratio(rows, level, model, n, k, "peak_bytes") if k else 1.0
                saved = ratio(rows, level, model, n, k, "saved_bytes") if k else 1.0
                lines.append(f"| {n} | {model} | {k or '-'} | {r['params'] / 1e6:.1f}M | {r['seconds'] * 1e3:.0f} | "
                             f"{speed:.2f} | {r['cpu_seconds'] * 1e3:.0f} | {speed_cpu:.2f} | "
                             f"{r['peak_bytes'] / mib:.0f} | {peak:.2f} | {r['saved_bytes'] / mib:.0f} | "
                             f"{saved:.2f} |".replace(f"| 0 | {saved:.2f} |", "| - | - |"))
        lines += ["", "Time growth per doubling of n (t(2n) / t(n)) and the crossover length where the model "
                  "becomes faster than full attention:", "",
                  "| time | model | k | " + " | ".join(f"{n}->{2 * n}" for n in lengths[:-1]) + " | crossover n |",
                  "|---|---|---|" + "---|" * len(lengths)]
        for key, measure_name in (("seconds", "wall"), ("cpu_seconds", "CPU")):
            for model, k, _ in series(rows, level, k_values):
                grow = " | ".join(f"{growth(rows, level, model, k, n, key):.2f}" for n in lengths[:-1])
                cross = "-" if k is None else crossover(rows, level, model, k, lengths, key)
                lines.append(f"| {measure_name} | {model} | {k or '-'} | {grow} | {cross} |")
        lines.append("")
    lines += summary(rows, levels, k_values, lengths)
    lines += [
        "## Anchors",
        "",
        f"- {LINFORMER_PAPER}; at n = 65536, 20x faster. Those are GPU inference numbers with layerwise sharing; "
        "these are CPU training steps (forward + backward) with headwise sharing, where the full-attention "
        "baseline is already the memory-efficient fused SDPA kernel (no n x n matrix kept), so memory ratios "
        "are much smaller than 14x: what is left is the O(n^2) compute.",
        "- FlashAttention paper (A100): fused exact attention is faster than Linformer below n of about 512 to "
        "1024. Here the crossover is stated per table above.",
        "",
        "![time and memory vs n](linear_attention.png)",
    ]
    return "\n".join(lines) + "\n"


def measure_grid(args, levels: list[str], lengths: list[int], k_values: list[int],
                 run: harness.Run) -> tuple[list[dict], float]:
    start = time.perf_counter()
    rows: list[dict] = []
    for level in levels:
        for n in lengths:
            if level == "encoder" and n > args.encoder_max_n:
                continue
            for model in MODELS:
                for k in ([None] if model == "full" else k_values):
                    row = run_child(level, model, n, k or 0, args)
                    rows.append(run.add(**row))
                    print(f"{level:7s} n={n:5d} {model:14s} k={k or '-':>3} {row['seconds'] * 1e3:9.0f} ms  "
                          f"peak {row['peak_bytes'] / 2**20:7.0f} MiB  saved {row['saved_bytes'] / 2**20:7.0f} MiB",
                          flush=True)
    return rows, (time.perf_counter() - start) / 60


def main() -> int:
    parser = harness.arguments(__doc__, threads=2, output="linear_attention.md")
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
    parser.add_argument("--k", default="128,256")
    parser.add_argument("--levels", default="layer,encoder")
    parser.add_argument("--encoder-max-n", type=int, default=8192, help="skip the 8-layer encoder above this n")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3, help="timed reps per layer measurement")
    parser.add_argument("--encoder-reps", type=int, default=1, help="timed reps per 8-layer encoder measurement")
    parser.add_argument("--quick", action="store_true", help="n = 512, 1024, layer only, k = 128, one rep")
    parser.add_argument("--from-json", type=Path, help="re-render the report and plot from a run's saved .json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(**json.loads(args.child))))
        return 0
    lengths = [int(n) for n in args.lengths.split(",")]
    k_values = [int(k) for k in args.k.split(",")]
    levels = args.levels.split(",")
    if args.quick:
        lengths, k_values, levels, args.reps, args.encoder_reps = [512, 1024], [128], ["layer"], 1, 1

    if args.from_json:  # a report made again, not a run: no row
        run = json.loads(args.from_json.read_text())
        rows, minutes, command = run["rows"], run["minutes"], run["command"]
    else:
        command = harness.command_line()
        with harness.Run("linear_attention", machine=harness.machine_line(threads=args.threads),
                         batch=args.batch) as run:
            rows, minutes = measure_grid(args, levels, lengths, k_values, run)
        harness.report(args.output.with_suffix(".json"),
                       json.dumps(dict(command=command, minutes=minutes, rows=rows), indent=1))
    plot(rows, levels, k_values, args.output.with_suffix(".png"))
    harness.report(args.output, report(rows, args, levels, lengths, k_values, minutes, command))
    print(f"wrote {args.output.with_suffix('.png')} in {minutes:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
