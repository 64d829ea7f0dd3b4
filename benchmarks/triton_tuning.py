"""The fused relative-attention kernel's host cost per call and its tilings, on a CUDA GPU (issue 37): what a GPU
session runs after benchmarks/gpu_session.sh when time is left, to choose launch.configs from
measurements instead of ptxas's register report.

  host    the host's time to issue one call at a small shape (1 x 4 heads x 128 x 64, bfloat16), where the device
          waits for the host: plain SDPA forward + backward, the kernel's forward + backward through its public
          entry and through its forward operator, its forward alone, one forward launch through wrap_triton, through
          triton's Autotuner and straight at the jitted kernel, and a three-argument Triton kernel (the floor of a
          launch); then cProfile's view of 200 calls (host_profile.txt)
  ladder  forward and backward at the library's first tilings, one feature added at a time (plain; dropout 0.1;
          1/8 of one row padded; + the row table; + the key table; + dropout: composite+key), each against SDPA
          with the same padding and dropout: what each feature costs
  tilings each kernel (forward, backward) with one tiling forced at a time, at three shapes
          (32 x 4 heads x 512, 8 x 4 x 2,048, 2 x 12 x 8,192; 64-channel heads, bfloat16) and two problems:
          "plain" (no terms, no padding, no dropout; against SDPA's flash kernel) and "composite+key" (both tables,
          r = 8, clip, 1/8 of one row padded, dropout 0.1; against SDPA with that mask and dropout); the backward's
          tilings are those of its key-major kernel (its preprocessing and dQ's sum stream rows untuned)

Every tiling is compiled first by worker processes in parallel (Triton's disk cache passes them on), then timed
one after the other: triton.testing.do_bench, the median, the L2 cache flushed between calls. Results go to --out
as they come: tuning.json, tuning.md, host_profile.txt. About 2 minutes on an H200.

    python benchmarks/triton_tuning.py --out $OUT --deadline $(( $(date +%s) + 300 ))
    TRITON_INTERPRET=1 python benchmarks/triton_tuning.py --rehearse     # on CPU: tiny shapes, few tilings
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import harness

from convattn.attention.relative import triton_attention
from convattn.attention.relative.triton import kernels, launch, operator

KERNELS = ("forward", "backward")
# (BLOCK_M, BLOCK_N, num_warps, num_stages): each kernel's list starts with the library's own candidates in half
# precision at 64 channels (launch.configs), in its order, then alternatives. The backward's alternatives: its
# one-stage picks' pipelined twins, and the tilings of the former key kernel that were fastest on an H200
# (results/gpu_session/session2/tuning.md)
TILINGS = {
    "forward": [(128, 64, 8, 3), (128, 32, 4, 3), (128, 64, 4, 3), (128, 32, 8, 2), (128, 64, 4, 4),
                (128, 128, 8, 3), (128, 128, 4, 2), (64, 64, 4, 3), (64, 128, 4, 3), (64, 32, 4, 2)],
    "backward": [(64, 64, 4, 1), (128, 64, 8, 1), (32, 64, 4, 1), (32, 64, 8, 1), (64, 64, 4, 3), (32, 64, 4, 3),
                 (64, 128, 4, 2), (32, 128, 4, 3), (16, 128, 4, 3), (32, 128, 4, 5)],
}
SHAPES = [(32, 4, 512), (8, 4, 2048), (2, 12, 8192)]  # (batch, heads, n)
# the rehearsal's one shape, a single program a launch at the interpreter's tiles: under TRITON_INTERPRET=1 each program
# is interpreted op by op, so a larger shape multiplies the seconds of each stage, which `TRITON_INTERPRET=1 python
# benchmarks/triton_tuning.py --rehearse` prints
REHEARSAL_SHAPE = (1, 1, 16)
# what each problem adds to plain attention: 1/8 of one row padded, the row table, the key table, dropout 0.1
FEATURES = {"plain": (), "dropout": ("dropout",), "padding": ("padding",), "padding+row": ("padding", "row"),
            "padding+row+key": ("padding", "row", "key"), "composite+key": ("padding", "row", "key", "dropout")}
PROBLEMS = ("plain", "composite+key")  # the tilings' sweep
LADDER = tuple(FEATURES)  # one feature more at a time, at the library's own first tilings
HEAD_DIM, REACH = harness.HEAD_DIM, harness.REACH
LIBRARY_CONFIGS = launch.configs


def force(tilings: dict[str, tuple]) -> None:
    """Make the kernels launch exactly these tilings (one per kernel; the library's first candidate for the
    others)."""
    chosen = {kernel: LIBRARY_CONFIGS(kernel, HEAD_DIM, torch.bfloat16)[0] for kernel in KERNELS} | tilings
    launch.configs = lambda kernel, head_dim, dtype: [chosen[kernel]]
    launch.autotuned.cache_clear()


def operands(problem: str, batch: int, heads: int, n: int, device: str, dtype: torch.dtype):
    """(q, k, v, row_table, key_table, keep, dropout_p) of `problem`, the key mask in bytes as the runners take it."""
    q, k, v, row, key, keep, p = harness.kernel_operands(FEATURES[problem], batch, heads, n, HEAD_DIM, reach=REACH,
                                                         device=device, dtype=dtype,
                                                         generator=torch.Generator(device).manual_seed(0))
    return q, k, v, row, key, None if keep is None else keep.view(torch.uint8), p


def kernel_calls(problem: str, shape: tuple, device: str, dtype: torch.dtype):
    """forward() and backward() of the kernels on one problem, straight at the runners (no autograd)."""
    q, k, v, row, key, keep, p = operands(problem, *shape, device, dtype)
    options = (0, REACH, True, p, HEAD_DIM**-0.5)
    seed = torch.tensor(5, device=device)
    out, lse = launch.run_forward(q, k, v, row, key, keep, None, seed, *options)
    grad = torch.randn_like(out)

    def forward():
        launch.run_forward(q, k, v, row, key, keep, None, seed, *options)

    def backward():
        launch.run_backward(grad, q, k, v, out, lse, row, key, keep, None, seed, *options)
    return forward, backward


def sdpa_calls(problem: str, shape: tuple, device: str, dtype: torch.dtype):
    q, k, v, _, _, keep, p = operands(problem, *shape, device, dtype)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    mask = None
    if keep is not None:
        mask = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(keep == 0, float("-inf"))[:, None,
                                                                                                          None, :]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    grad = torch.randn_like(out)

    def forward():
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)

    def both():
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p).backward(grad)
    return forward, both


def compile_job(job: tuple) -> tuple:
    """Run one (kernel, tiling, problem) once at a small shape, so that Triton compiles and caches it."""
    kernel, tiling, problem, rehearse = job
    try:
        device, dtype = ("cpu", torch.float32) if rehearse else ("cuda", torch.bfloat16)
        force({kernel: tuple(tiling)} if kernel in KERNELS else {})
        forward, backward = kernel_calls(problem, (1, 4, 64) if not rehearse else REHEARSAL_SHAPE, device, dtype)
        if kernel in ("forward", "all"):
            forward()
        if kernel != "forward":
            backward()
        return job, None
    except Exception as error:  # a tiling the GPU cannot hold (shared memory) is recorded, not fatal
        return job, f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"


def bench(fn, rehearse: bool) -> float:
    """Milliseconds per call, the median."""
    if rehearse:  # the interpreter compiles nothing ahead: its first call is already a call like any other
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


class Session:
    def __init__(self, out: Path, deadline: float, rehearse: bool):
        self.out, self.deadline, self.rehearse = out, deadline, rehearse
        self.results: dict = {"device": "cpu (rehearsal)" if rehearse else torch.cuda.get_device_name(),
                              "torch": torch.__version__, "host": {}, "failed": {}, "tilings": [], "sdpa": []}
        self.device, self.dtype = ("cpu", torch.float32) if rehearse else ("cuda", torch.bfloat16)

    def left(self) -> float:
        return self.deadline - time.time()

    def save(self) -> None:
        (self.out / "tuning.json").write_text(json.dumps(self.results, indent=1))
        (self.out / "tuning.md").write_text(self.report())

    # host

    def host_costs(self) -> None:
        shape = (1, 4, 128) if not self.rehearse else REHEARSAL_SHAPE
        q, k, v, *_ = operands("plain", *shape, self.device, self.dtype)
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        grad = torch.randn_like(q)
        seed = torch.tensor(5, device=self.device)
        options = (0, REACH, True, 0.0, HEAD_DIM**-0.5)
        force({})
        problem = launch.Problem(q, None, None, None, None, None, 0, REACH, True, 0.0, HEAD_DIM**-0.5)
        out = torch.empty_like(q)
        lse = torch.empty(problem.stats_shape, dtype=torch.float32, device=q.device)
        args = problem.forward_arguments(q, k, v, out, lse)
        launch.launch("forward", problem, problem.grid("BLOCK_M"), args)
        m, n_, w, s = TILINGS["forward"][0]
        arms = {
            "sdpa forward + backward": lambda: F.scaled_dot_product_attention(q, k, v).backward(grad),
            "kernel forward + backward (entry)":
                lambda: triton_attention.triton_relative_attention(q, k, v, None, None, reach=REACH,
                                                                   clip=True).backward(grad),
            "kernel forward + backward (operator)":
                lambda: operator.attention_forward(q, k, v, None, None, None, None, seed, *options)[0].backward(grad),
            "kernel forward alone (runner)":
                lambda: launch.run_forward(q.detach(), k.detach(), v.detach(), None, None, None, None, None,
                                           *options),
            "one forward launch (wrap_triton)": lambda: launch.launch("forward", problem, problem.grid("BLOCK_M"),
                                                                      args),
        }
        if not self.rehearse:
            tuner = launch.AUTOTUNERS["forward", HEAD_DIM, q.dtype]
            arms["one forward launch (triton Autotuner)"] = lambda: tuner[problem.grid("BLOCK_M")](
                *args, **problem.keywords)
            arms["one forward launch (jitted kernel)"] = lambda: kernels.forward_kernel[
                problem.grid("BLOCK_M")](*args, **problem.keywords, BLOCK_M=m, BLOCK_N=n_, num_warps=w,
                                         num_stages=s)
            arms["a 3-argument triton kernel"] = trivial_launch()
        calls, warmup = (300, 5) if not self.rehearse else (1, 1)
        for name, fn in arms.items():
            for _ in range(warmup):
                fn()
            self.sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            issued = time.perf_counter()
            self.sync()
            done = time.perf_counter()
            self.results["host"][name] = {"issue_us": (issued - start) / calls * 1e6,
                                          "wall_us": (done - start) / calls * 1e6}
            self.save()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(200 if not self.rehearse else 1):
            arms["kernel forward + backward (entry)"]()
        profiler.disable()
        self.sync()
        text = io.StringIO()
        for order in ("tottime", "cumulative"):
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(35)
        (self.out / "host_profile.txt").write_text(text.getvalue())

    def sync(self) -> None:
        if not self.rehearse:
            torch.cuda.synchronize()

    # tilings

    def precompile(self) -> None:
        jobs = [("all", None, problem, self.rehearse) for problem in LADDER]
        jobs += [(kernel, tiling, problem, self.rehearse) for problem in PROBLEMS for kernel in KERNELS
                 for tiling in self.tilings(kernel)]
        # the rehearsal's pool has one process: the interpreter compiles nothing, so a second would only import again
        workers = 1 if self.rehearse else min(14, os.cpu_count() or 1)
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            for (kernel, tiling, problem, _), error in pool.map(compile_job, jobs):
                if error:
                    self.results["failed"][f"{problem} {kernel} {tiling}"] = error
        self.save()

    def ladder(self) -> None:
        """Each problem at the library's first tilings, forward and backward, against SDPA with the same padding
        and dropout: what each feature costs."""
        force({})
        for shape in SHAPES if not self.rehearse else [REHEARSAL_SHAPE]:
            for problem in LADDER:
                if self.left() < 5:
                    self.results["unfinished"] = "the deadline came first"
                    return
                forward, backward = kernel_calls(problem, shape, self.device, self.dtype)
                sdpa_forward, sdpa_both = sdpa_calls(problem, shape, self.device, self.dtype)
                times = {"forward_ms": bench(forward, self.rehearse), "backward_ms": bench(backward, self.rehearse),
                         "sdpa_forward_ms": bench(sdpa_forward, self.rehearse)}
                times["sdpa_backward_ms"] = bench(sdpa_both, self.rehearse) - times["sdpa_forward_ms"]
                self.results.setdefault("ladder", []).append({"problem": problem, "shape": shape, **times})
            self.save()

    def tilings(self, kernel: str) -> list[tuple]:
        return TILINGS[kernel][:2] if self.rehearse else TILINGS[kernel]

    def sweep(self) -> None:
        shapes = SHAPES if not self.rehearse else [REHEARSAL_SHAPE]
        for problem in PROBLEMS:
            for shape in shapes:
                sdpa_forward, sdpa_both = sdpa_calls(problem, shape, self.device, self.dtype)
                self.results["sdpa"].append({"problem": problem, "shape": shape, "forward_ms": bench(sdpa_forward,
                                             self.rehearse), "both_ms": bench(sdpa_both, self.rehearse)})
                for kernel in KERNELS:
                    for tiling in self.tilings(kernel):
                        if self.left() < 5:
                            self.results["unfinished"] = "the deadline came first"
                            return self.save()
                        if f"{problem} {kernel} {tiling}" in self.results["failed"]:
                            continue
                        force({kernel: tiling})
                        forward, backward = kernel_calls(problem, shape, self.device, self.dtype)
                        ms = bench(forward if kernel == "forward" else backward, self.rehearse)
                        self.results["tilings"].append({"problem": problem, "shape": shape, "kernel": kernel,
                                                        "tiling": tiling, "ms": ms})
                self.save()

    def report(self) -> str:
        r = self.results
        lines = [f"# The kernel's host cost and tilings: {r['device']}, torch {r['torch']}", ""]
        if r.get("ladder"):
            lines += ["## What each feature costs (the library's first tilings; SDPA with the same padding and "
                      "dropout)", "", "| batch x heads x n | problem | forward ms | vs SDPA | backward ms | vs SDPA |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {' x '.join(map(str, row['shape']))} | {row['problem']} | {row['forward_ms']:.3f} | "
                      f"{row['forward_ms'] / row['sdpa_forward_ms']:.2f}x | {row['backward_ms']:.3f} | "
                      f"{row['backward_ms'] / row['sdpa_backward_ms']:.2f}x |" for row in r["ladder"]]
            lines.append("")
        if r["host"]:
            lines += ["## Host time per call (1 x 4 heads x 128 x 64)", "", "| call | issue us | wall us |",
                      "|---|---|---|"]
            lines += [f"| {name} | {v['issue_us']:.1f} | {v['wall_us']:.1f} |" for name, v in r["host"].items()]
            lines.append("")
        for problem in PROBLEMS:
            for sdpa in (s for s in r["sdpa"] if s["problem"] == problem):
                shape = tuple(sdpa["shape"])
                rows = [t for t in r["tilings"] if t["problem"] == problem and tuple(t["shape"]) == shape]
                if not rows:
                    continue
                backward_sdpa = sdpa["both_ms"] - sdpa["forward_ms"]
                lines += [f"## {problem}, batch x heads x n = {' x '.join(map(str, shape))}: SDPA forward "
                          f"{sdpa['forward_ms']:.3f} ms, backward {backward_sdpa:.3f} ms", "",
                          "| kernel | tiling (M, N, warps, stages) | ms | vs SDPA's forward or backward |",
                          "|---|---|---|---|"]
                for row in sorted(rows, key=lambda t: (KERNELS.index(t["kernel"]), t["ms"])):
                    against = sdpa["forward_ms"] if row["kernel"] == "forward" else backward_sdpa
                    lines.append(f"| {row['kernel']} | {tuple(row['tiling'])} | {row['ms']:.3f} | "
                                 f"{row['ms'] / against:.2f}x |")
                best = {kernel: min((t["ms"] for t in rows if t["kernel"] == kernel), default=float("nan"))
                        for kernel in KERNELS}
                lines += ["", f"Best forward {best['forward']:.3f} ms ({best['forward'] / sdpa['forward_ms']:.2f}x); "
                          f"backward {best['backward']:.3f} ms ({best['backward'] / backward_sdpa:.2f}x).", ""]
        if r["failed"]:
            lines += ["## Tilings that failed to compile or run", ""]
            lines += [f"- {name}: {error}" for name, error in r["failed"].items()]
        if r.get("unfinished"):
            lines += ["", f"Unfinished: {r['unfinished']}."]
        return "\n".join(lines) + "\n"


def trivial_launch():
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(X, n, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(X + offsets, tl.load(X + offsets, mask=offsets < n) + 1, mask=offsets < n)

    x = torch.zeros(64, device="cuda")
    return lambda: add_one[(1,)](x, 64, BLOCK=64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results/triton_tuning")))
    parser.add_argument("--deadline", type=float, default=time.time() + 300, help="epoch seconds to stop by")
    parser.add_argument("--rehearse", action="store_true", help="CPU, tiny shapes, two tilings per kernel")
    args = parser.parse_args()
    if args.rehearse and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--rehearse runs the kernels under TRITON_INTERPRET=1: set it in the environment")
    args.out.mkdir(parents=True, exist_ok=True)
    session = Session(args.out, args.deadline, args.rehearse)
    for stage in (session.host_costs, session.precompile, session.ladder, session.sweep):
        started = time.time()
        try:
            stage()
        except Exception:
            session.results["failed"][stage.__name__] = traceback.format_exc()[-2000:]
        print(f"triton_tuning: {stage.__name__} took {time.time() - started:.0f} s", flush=True)
        session.save()
    print(session.report())
    record(session.results, args.rehearse)


def record(results: dict, rehearse: bool) -> None:
    """The session's figures as one row of benchmarks/results/triton_tuning.jsonl."""
    machine = harness.machine_line("cpu" if rehearse else "cuda", packages=("torch", "triton"), threads=rehearse)
    with harness.Run("triton_tuning", machine=machine, failed=sorted(results["failed"]),
                     unfinished=results.get("unfinished")) as run:
        for call, times in results["host"].items():
            run.add(stage="host", call=call, **times)
        for stage in ("ladder", "sdpa", "tilings"):
            for row in results.get(stage, []):
                run.add(stage=stage, **row)


if __name__ == "__main__":
    main()
