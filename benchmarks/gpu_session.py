"""One GPU session in one command (issues 37, 47 and 62): what a user of the fused relative-attention kernel meets,
ordered by what decides the GPU speed issue's bars, each stage time-boxed and writing its file as soon as it finishes
a row. The call's plan (each stage's budget and rows, in order) is printed before anything runs.

  warm-up  at the call's start, background processes compile every Triton tiling the stages will launch (the
           autotuner's candidates for each row: the gate's, the kernels stage's, the training step's attention) into
           Triton's cache, the first rows' first (kernel_tilings.py); stopped when the kernels stage ends. Every
           stage runs with TRITON_CACHE_AUTOTUNING=1: the autotuner's picks go to the same cache, and a later stage
           (or one started again) launches them without timing the tilings again
  gate     (45 s) the kernel against SDPA and float64 at one small shape, output and every gradient, each tiling,
           each dQ design (gpu_gate.py): a failure, or a gate that did not finish, marks every kernel and training
           row "unverified" (they are still measured)
  kernels  the device's time per forward + backward of attention alone: the sum of the device's kernels, copies and
           memsets under torch.profiler (not the wall clock), bf16, 64 channels a head. n = 2,048 and 8,192 first:
           plain (SDPA flash, the kernel in each dQ design; then both with dropout 0.1), then the relative terms
           (SDPA with the same mask and dropout, composite, composite+key; then padding alone and the key table
           alone); then n = 512 (32 x 4 and 128 x 4) in the same order. The kernels each arm ran are named
  train    the product's own training step (benchmarks/pretrain_step.py): `convattn pretrain` at the
           chang2021-small recipe's shape in bf16. Batch 128 first: composite and absolute (SDPA) as CUDA graphs
           (--compile-mode reduce-overhead), eager, then compiled; then transformers' BertForMaskedLM the same way;
           batch 512 with the time left. Tokens/s after the warm-up, the allocator's peak, the device's busy share;
           each compiled row its graph breaks and cudagraph skips (a graphs row with any says "not graphed"). Needs
           the kit (.gpu-kit, carried: `datasets`' wheels, the recipe's tokenizer, the text); without it the rows
           say so
  tests    the packages the call relies on, imported, their versions (the kit's wheels among them); then the
           kernel's tests a GPU runs (cuda_selection.py reads them from their marks), the bars' first, every one
           (no -x), each failure with its message
  host     the host's time per call (no profiler) and per launch, every arm at 32 x 4 x 512; composite's and
           composite+key's also through torch.library's operators (the eager path before 2026-12-01)
  flex     with the time left: FlexAttention without a score_mod (PyTorch's own Triton kernels, compiled) at
           8 x 4 x 2,048 beside SDPA flash and the plain kernel: the Triton floor on that GPU
  summary  the gate, every bar with its verdict (pass / fail, "unverified" where the gate did not pass) on the
           named device, the stages' tables: summary.md, printed last

An arm that fails (an exception, out of memory) is recorded with its reason and the stage goes on; one that breaks
the CUDA context ends its stage's process, and the session starts the stage again without that arm. A stage that
runs out of time records what it did not measure. A stage continues the rows its file already holds (the session
removes the files first). Files (the device call's 8): session.log, gate.json, kernels.json, train.json,
tests.json, host.json, flex.json, summary.md.

    bash benchmarks/gpu_session.sh               # the GPU machine's one call: every stage in about 8 minutes
    bash benchmarks/gpu_session.sh --rehearse    # on CPU: tiny shapes, the kernel under TRITON_INTERPRET=1 (CI)
    bash benchmarks/gpu_session.sh --stage kernels --deadline $(( $(date +%s) + 120 ))    # one stage by hand

The rehearsal runs every stage in the call's order at tiny shapes (the compiled training rows skipped), resolves the
tests a GPU would run from their marks and runs the first of them under the interpreter, and prints the GPU call's
plan first. Files go to --out: $OUT where set (the GPU machine's folder that comes back), else
benchmarks/results/gpu_session (or a temporary folder when rehearsing).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gpu_gate
import harness
import kernel_tilings
import pretrain_step

# torch, transformers and convattn are imported where a stage measures (seconds each): the session's own process and
# the tests stage's need none of them

ROOT = Path(__file__).resolve().parents[1]
# the kernel's tests, wherever the kernel's rework puts them
TEST_GLOBS = ("tests/attention/relative/test_triton*.py", "tests/attention/relative/triton/**/test_*.py")
# Seconds per stage, in the call's order; a stage may use what the ones before it left. 490 s in all: the device
# call's command may run 600 s, and the session's 15 minutes of device time hold the machine's start (a minute or
# more) and the files' return too. Triton's and Inductor's compilation fall inside the stages (the warm-up's beside
# the gate and the kernels stage). The gate's 45 s hold the kit's wheels' install (gpu_session.sh stamps the call's
# start before it: 7 s on the 2026-11-30 call, whose 20 s gate was stopped at 13 s compiling its first tiling), the
# imports, and the compilation of its 16 (case, design, tiling) units, which the warm-up's 10 processes share with
# it; the kernels stage took 69 s of its 150 there once the warm-up had compiled its tilings.
GPU_BUDGETS = {"gate": 45, "kernels": 125, "train": 220, "tests": 70, "host": 20, "flex": 10}
# the rehearsal's: room for a loaded CPU (2 cores shared), so that no stage is cut short by the machine's load
REHEARSAL_BUDGETS = {"gate": 240, "kernels": 400, "train": 600, "tests": 400, "host": 300, "flex": 240}
# a stage's own deadline comes this much before its process is stopped: the gate starts no tiling after it, whose
# compilation may take 9 s (the 2026-11-30 call's longest warm-up unit: 9.5 s)
SLACK = 10
RESTART = 75  # a stage's exit status after an arm broke the CUDA context
RESTARTS = 3  # at most this many times a stage starts again after its process died (a crash in an arm)
SPEC = ("tests", "gate", "batch", "heads", "n", "mode", "arm", "design", "path")  # the fields that name a row
# the host stage's kernel arms also timed through torch.library's operators, the eager path before 2026-12-01
# (operator._EagerAttention): what skipping them gives a GPU's host, from one process
OPERATOR_ARMS = ("+row table", "composite+key")
DROPOUT = 0.1


@dataclass(frozen=True)
class Design:
    """A design of the kernel's backward for dQ, which the kernels stage times side by side and the gate checks."""

    select: Callable[[], contextlib.AbstractContextManager] | None  # entered around each call; None: the default
    deterministic: bool  # two backward passes give the same bits


@contextlib.contextmanager
def dq_environment(design: str):
    """CONVATTN_TRITON_DQ=design inside: the variable the kernel's rework reads at each backward launch to choose its
    dQ design (a kernel without it ignores it)."""
    before = os.environ.get("CONVATTN_TRITON_DQ")
    os.environ["CONVATTN_TRITON_DQ"] = design
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CONVATTN_TRITON_DQ", None)
        else:
            os.environ["CONVATTN_TRITON_DQ"] = before


# "split": dQ in float32 accumulators, one per split of the key blocks, summed in split order afterwards; "atomic":
# one accumulator a program per key block adds into atomically (launch.DQ_DESIGNS). Each named explicitly, so that
# the kernel's own default choice does not decide what a row measures. The plans time and check both, side by side.
DESIGNS = {"split": Design(lambda: dq_environment("split"), True),
           "atomic": Design(lambda: dq_environment("atomic"), False)}


@dataclass(frozen=True)
class Arm:
    kind: str  # "sdpa", "kernel" or "flex"
    dropout: float
    padding: bool
    terms: tuple[str, ...] = ()
    baseline: str = ""  # the SDPA arm it is measured against
    given_tables: bool = False  # the tables built by torch outside the kernel, as before they were projected in it


ARMS = {
    "sdpa": Arm("sdpa", 0.0, False),  # flash
    "sdpa+dropout": Arm("sdpa", DROPOUT, False),  # flash
    "sdpa+padding": Arm("sdpa", DROPOUT, True),  # the same mask and dropout as the kernel's: the backend SDPA picks
    "plain": Arm("kernel", 0.0, False, baseline="sdpa"),
    "+dropout": Arm("kernel", DROPOUT, False, baseline="sdpa+dropout"),
    "+padding": Arm("kernel", DROPOUT, True, baseline="sdpa+padding"),
    "+row table": Arm("kernel", DROPOUT, True, ("fixed", "dynamic_query"), "sdpa+padding"),  # composite
    "+key table": Arm("kernel", DROPOUT, True, ("dynamic_key",), "sdpa+padding"),
    "composite+key": Arm("kernel", DROPOUT, True, ("fixed", "dynamic_query", "dynamic_key"), "sdpa+padding"),
    # the same two with their tables built outside the kernel and given (the 2026-11-30 call's design), in one dQ
    # design: what projecting them inside the kernel's launches gained, from one process
    "+row table, given": Arm("kernel", DROPOUT, True, ("fixed", "dynamic_query"), "sdpa+padding", True),
    "composite+key, given": Arm("kernel", DROPOUT, True, ("fixed", "dynamic_query", "dynamic_key"), "sdpa+padding",
                                True),
    "flex": Arm("flex", 0.0, False, baseline="sdpa"),  # FlexAttention without a score_mod (the flex stage)
}
# the kernels stage's arms in its order, each group at every shape before the next: plain (its bar from n = 2,048),
# then dropout, then the relative terms' bars, then the other arms
ARM_GROUPS = (("sdpa", "plain"), ("sdpa+dropout", "+dropout"), ("sdpa+padding", "+row table", "composite+key"),
              ("+padding", "+key table"), ("+row table, given", "composite+key, given"))
# (arm, limit, from which n: 0 every shape, else the plan's `long`): device time over its baseline's, at most
KERNEL_BARS = (("plain", 1.15, "long"), ("+dropout", 1.3, 0), ("+row table", 1.35, 0), ("composite+key", 1.6, 0))
BAR_NAMES = {"plain": "plain kernel vs SDPA flash", "+dropout": "kernel + dropout 0.1 vs SDPA flash + dropout",
             "+row table": "composite vs SDPA with the same mask and dropout",
             "composite+key": "composite+key vs SDPA with the same mask and dropout"}
# the training step: composite's tokens/s over absolute's, at least (per mode); its peak over absolute's, at most
TOKENS_BARS, MEMORY_BAR = {"graphs": 0.9, "eager": 0.8, "compiled": 0.9}, 1.1


@dataclass(frozen=True)
class Plan:
    device: str
    dtype: str  # torch's name
    shapes: tuple[tuple[int, int, int], ...]  # (batch, heads, n) of the kernels stage, the longest first
    host_shapes: tuple[tuple[int, int, int], ...]
    long: int  # the plain kernel's bar holds from this n; the kernels stage measures these lengths first
    head_dim: int
    warmup: int
    profiled: int  # steps profiled per kernels row
    host_steps: int
    train: pretrain_step.TrainPlan
    budgets: dict  # seconds per stage, in the call's order
    gate_shape: tuple[int, int, int]  # (batch, heads, n) of the gate
    flex_shape: tuple[int, int, int]
    train_attention: tuple[tuple[int, int, int], ...]  # the training step's attention, for the warm-up
    designs: tuple[str, ...] = tuple(DESIGNS)  # the dQ designs timed and checked
    warm_workers: int = 0  # the warm-up's processes
    tests_limit: int | None = None  # run the first this many tests of the selection (None: all)
    warm_limit: int | None = None  # warm the first this many units (None: all)
    flash: bool = True  # SDPA without a mask through its flash backend
    compile_flex: bool = True  # FlexAttention through torch.compile (eager, it is a reference implementation)
    work: str = ""  # the train stage's scratch folder (the session's; set by main)
    collect: bool = True  # a full garbage collection after each row: what cycles hold goes before the next row

    @property
    def rehearsal(self) -> bool:
        return self.device != "cuda"


# 10 warm-up processes: the machine has 16 cores, and the stage and the gate want theirs. n = 120: a padded batch of
# the recipe's lines whose longest is 120 tokens (a multiple of 8, not of 16: Triton specialises the kernel apart)
GPU = Plan("cuda", "bfloat16", ((8, 4, 2048), (2, 12, 8192), (32, 4, 512), (128, 4, 512)), ((32, 4, 512),),
           long=2048, head_dim=64, warmup=3, profiled=10, host_steps=20, train=pretrain_step.GPU_TRAIN,
           budgets=GPU_BUDGETS, gate_shape=(4, 8, 512), flex_shape=(8, 4, 2048),
           train_attention=((2, 4, 128), (2, 4, 120)), warm_workers=10)
# Under the interpreter every kernel call is seconds of Python: one tiny shape, one call of each kind; one warm-up
# process for the gate's four units, both dQ designs (the interpreter compiles nothing, so more processes or units
# would only import or run kernels again); the first two tests of the selection;
# no garbage collection after each row (its tensors are tiny, and with transformers' models imported a collection
# costs more than the row: python -c "import time, gc, transformers.modeling_utils; t = time.time(); gc.collect();
# print(time.time() - t)")
REHEARSAL = Plan("cpu", "float32", ((1, 1, 16),), ((1, 1, 16),), long=0, head_dim=16, warmup=0, profiled=1,
                 host_steps=1, train=pretrain_step.REHEARSAL_TRAIN, budgets=REHEARSAL_BUDGETS, gate_shape=(1, 2, 40),
                 flex_shape=(1, 1, 16), train_attention=((1, 1, 16),), warm_workers=1, warm_limit=4, tests_limit=2,
                 flash=False, compile_flex=False, collect=False)


def write_atomic(path: Path, text: str) -> None:
    """`text` into `path`, whole or not at all (a reader never sees half a file)."""
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(text)
    staged.replace(path)


# --- the rows of each stage, in the order they run ---------------------------------------------------------------

def shape_row(shape: tuple[int, int, int], arm: str, design: str | None = None) -> dict:
    row = dict(zip(("batch", "heads", "n"), shape, strict=True), arm=arm)
    return {**row, "design": design} if design else row


def gate_rows(plan: Plan) -> list[dict]:
    batch, heads, n = plan.gate_shape
    return [dict(gate=case, design=design, batch=batch, heads=heads, n=n) for design in plan.designs
            for case in gpu_gate.CASES]


def arm_rows(plan: Plan, shape: tuple[int, int, int], arm: str) -> list[dict]:
    """The arm at the shape: an SDPA arm once, a kernel arm in each dQ design (given tables in the first)."""
    if ARMS[arm].kind != "kernel":
        return [shape_row(shape, arm)]
    return [shape_row(shape, arm, design) for design in plan.designs[:1 if ARMS[arm].given_tables else None]]


def kernel_rows(plan: Plan) -> list[dict]:
    """The lengths from plan.long first, then the shorter ones; at each, ARM_GROUPS in order, a group at every shape
    before the next (plain at n = 2,048 and 8,192 first)."""
    rows = []
    for shapes in ([s for s in plan.shapes if s[2] >= plan.long], [s for s in plan.shapes if s[2] < plan.long]):
        for group in ARM_GROUPS:
            rows += [row for shape in shapes for arm in group for row in arm_rows(plan, shape, arm)]
    return rows


def host_rows(plan: Plan) -> list[dict]:
    rows = [shape_row(shape, arm, plan.designs[0] if ARMS[arm].kind == "kernel" else None)
            for shape in plan.host_shapes for arm in ARMS if ARMS[arm].kind != "flex"]
    return rows + [shape_row(shape, arm, plan.designs[0]) | {"path": "operators"} for shape in plan.host_shapes
                   for arm in OPERATOR_ARMS]


def train_rows(plan: Plan) -> list[dict]:
    return pretrain_step.rows(plan.train)


def test_rows(plan: Plan) -> list[dict]:
    return [{"tests": "packages"}, {"tests": "kernel"}]


def flex_rows(plan: Plan) -> list[dict]:
    """FlexAttention beside its baseline and the plain kernel, in one process (every ratio from one process)."""
    return [shape_row(plan.flex_shape, "sdpa"), shape_row(plan.flex_shape, "flex"),
            shape_row(plan.flex_shape, "plain", plan.designs[0])]


def warm_rows(plan: Plan) -> list[dict]:
    """What the warm-up compiles, in the call's order: the gate's cases, the kernels stage's kernel rows, then the
    training step's attention (composite, dropout and padding, at the recipe's lengths; its eager rows launch
    these, and the host and flex stages' kernel rows are among the kernels stage's)."""
    rows = gate_rows(plan) + [row for row in kernel_rows(plan) if ARMS[row["arm"]].kind == "kernel"]
    rows += [shape_row(shape, "+row table", design) for shape in plan.train_attention for design in plan.designs]
    seen, unique = set(), []
    for row in rows:
        if key(row) not in seen:
            seen.add(key(row))
            unique.append(row)
    return unique


def warm_units(plan: Plan, tilings: int) -> list[tuple[dict, int]]:
    """(row, tiling) pairs: each row's tilings next to each other, so that the processes compile them side by
    side."""
    return [(row, index) for row in warm_rows(plan) for index in range(tilings)]


def describe(row: dict) -> str:
    """A row in a few words: its case or arm, shape, dQ design, mode and batch."""
    if "tests" in row:
        return f"tests {row['tests']}"
    if "mode" in row:
        return f"{row['mode']} batch {row['batch']} {row['arm']}"
    what = f"{row['gate']} at" if "gate" in row else ""
    design = f" dQ {row['design']}" if row.get("design") else ""
    arm = "" if "gate" in row else f" {row.get('arm')}"
    shape = shape_name(row) if {"batch", "heads", "n"} <= row.keys() else f"n {row.get('n')}"
    return f"{what} {shape}{arm}{design}".strip()


def plan_lines(plan: Plan) -> list[str]:
    """The call's plan: each stage's budget and rows, in order."""
    total = sum(plan.budgets.values())
    lines = [f"stages in order, {total} s of budgets (a stage may use what the ones before it left); warm-up: "
             f"{plan.warm_workers} processes compile the tilings of {len(warm_rows(plan))} rows ahead (the gate's "
             "first)"]
    for stage, budget in plan.budgets.items():
        rows = STAGES[stage][0](plan)
        if stage == "tests":
            said = "the packages, then the kernel's tests a GPU runs, resolved from their marks (the bars' first)"
        else:
            said = "; ".join(describe(row) for row in rows)
        lines.append(f"{stage} ({budget} s, {len(rows)} rows): {said}")
    return lines


# --- one attention call, forward + backward ------------------------------------------------------------------------

def kernel_only(step):
    """`step`, whose first call raises where dispatch.py serves the kernel's arm with another path, so that a kernel
    arm never times something else (the paths dispatch.py has today; names it no longer has are skipped)."""
    from convattn.attention.relative import dispatch

    others = [name for name in ("attend", "decomposed_relative_attention", "blockwise_relative_attention",
                                "flex_relative_attention") if hasattr(dispatch, name)]
    checked = False

    def refuse(name):
        def call(*args, **kwargs):
            raise RuntimeError(f"the kernel's arm ran dispatch.{name} instead: no kernel behind it")
        return call

    def first_checked():
        nonlocal checked
        if checked:
            return step()
        originals = {name: getattr(dispatch, name) for name in others}
        try:
            for name in others:
                setattr(dispatch, name, refuse(name))
            step()
        finally:
            for name, function in originals.items():
                setattr(dispatch, name, function)
        checked = True
    return first_checked


def attention_step(row: dict, plan: Plan):
    """One attention call of the row's arm, forward + backward (a random upstream gradient, so that nothing but
    attention runs), and the tensors whose gradients each step leaves."""
    import torch
    import torch.nn.functional as F

    from convattn import ConvAttnConfig
    from convattn.attention.core import TokenMask
    from convattn.attention.relative import RelativePositionBias, dispatch
    from convattn.attn_implementations import TRITON_IMPLEMENTATION

    arm = ARMS[row["arm"]]
    batch, heads, n, d = row["batch"], row["heads"], row["n"], plan.head_dim
    device, dtype = plan.device, getattr(torch, plan.dtype)
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(batch, heads, n, d, device=device, dtype=dtype)
    keep = harness.padded_keep(batch, n, device) if arm.padding else torch.ones(batch, n, dtype=torch.bool,
                                                                                  device=device)
    if arm.kind == "sdpa":
        mask = keep[:, None, None, :] if arm.padding else None
        backend = None
        if plan.flash and not arm.padding:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            backend = SDPBackend.FLASH_ATTENTION

        def step():
            with contextlib.nullcontext() if backend is None else sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=arm.dropout)
            out.backward(grad)
        return step, [q, k, v]
    if arm.kind == "flex":
        from torch.nn.attention.flex_attention import flex_attention

        attend = torch.compile(flex_attention, dynamic=False) if plan.compile_flex else flex_attention

        def step():
            if plan.rehearsal:  # FlexAttention has no backward on CPU: the rehearsal runs its forward alone
                attend(q.detach(), k.detach(), v.detach())
                return
            attend(q, k, v).backward(grad)
        return step, [q, k, v]
    config = ConvAttnConfig.from_preset("chang2021-small/composite+key")
    relative = None
    if arm.terms:
        relative = RelativePositionBias(list(arm.terms), heads, d, config.relative_reach,
                                        config.relative_out_of_window).to(device, dtype)
        with torch.no_grad():
            for parameter in relative.parameters():  # never time on zeros
                parameter.normal_(0, 0.1)
    token_mask = TokenMask(keep)
    # without terms only the kernel's attn_implementation reaches it; with terms the forced path does
    implementation = "sdpa" if arm.terms else TRITON_IMPLEMENTATION

    select = DESIGNS[row.get("design") or plan.designs[0]].select

    def step():
        with (dispatch.forced_path("triton") if arm.terms else contextlib.nullcontext(),
              select() if select is not None else contextlib.nullcontext(),
              harness.through_operators() if row.get("path") == "operators" else contextlib.nullcontext()):
            # tables_from: the tables built from q and k by torch and given to the kernel (dispatch.kernel_inputs)
            out, _ = dispatch.relative_attention(q, k, v, relative, token_mask, dropout_p=arm.dropout,
                                                 attn_implementation=implementation,
                                                 tables_from=(q, k) if arm.given_tables else None)
        out.backward(grad)
    return kernel_only(step), [q, k, v, *(relative.parameters() if relative is not None else ())]


def stepper(step, tensors):
    def clear():
        for t in tensors:
            t.grad = None

    def one():
        step()
        clear()
    return one


def synchronize(plan: Plan) -> None:
    if plan.device == "cuda":
        import torch

        torch.cuda.synchronize()


def profiled(one, plan: Plan, steps: int):
    """torch.profiler over `steps` calls (synchronised at the end); the wall time per call under it, ms."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA if plan.device == "cuda" else ProfilerActivity.CPU]
    synchronize(plan)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            one()
        synchronize(plan)
        wall = (time.perf_counter() - start) / steps * 1e3
    return prof, wall


def kernel_names(events: list, steps: int, top: int = 8) -> list[dict]:
    """The device's kernels (copies and memsets too) by their time, per step: name, ms, calls."""
    time_of, calls = Counter(), Counter()
    for e in events:
        time_of[e.name] += e.time_range.elapsed_us()
        calls[e.name] += 1
    return [{"name": name[:200], "ms": round(us / steps / 1e3, 4), "calls": round(calls[name] / steps, 2)}
            for name, us in time_of.most_common(top)]


def device_time(row: dict, plan: Plan, deadline: float) -> dict:
    """Stage kernels: the device's time per call from the profiler's kernel sums, and the kernels' names."""
    one = stepper(*attention_step(row, plan))
    for _ in range(plan.warmup):
        one()
    prof, wall = profiled(one, plan, plan.profiled)
    result = {"wall_ms": round(wall, 4), "steps": plan.profiled, "device_ms": None, "launches": None}
    if plan.device == "cuda":
        result.update(harness.device_time(prof, plan.profiled, digits=(4, 2)))
        result["kernels"] = kernel_names(harness.device_events(prof), plan.profiled)
    return result


def host_time(row: dict, plan: Plan, deadline: float) -> dict:
    """Stage host: the host's time to issue one call (forward + backward) without the profiler, the call's wall
    time, and from a profiled call the device's launches and time."""
    one = stepper(*attention_step(row, plan))
    for _ in range(plan.warmup):
        one()
    host, wall = [], []
    for _ in range(plan.host_steps):
        synchronize(plan)
        start = time.perf_counter()
        one()
        issued = time.perf_counter()
        synchronize(plan)
        host.append((issued - start) * 1e3)
        wall.append((time.perf_counter() - start) * 1e3)
    result = {"host_ms": round(statistics.median(host), 4), "wall_ms": round(statistics.median(wall), 4),
              "steps": plan.host_steps, "device_ms": None, "launches": None, "host_us_per_launch": None}
    if plan.device != "cuda":  # no device, no launches
        return result
    steps = min(3, plan.host_steps)
    prof, _ = profiled(one, plan, steps)
    result.update(harness.device_time(prof, steps, digits=(4, 2)))
    if result["launches"]:
        result["host_us_per_launch"] = round(result["host_ms"] * 1e3 / result["launches"], 2)
    return result


def train_step(row: dict, plan: Plan, deadline: float) -> dict:
    return pretrain_step.measure(row, plan.train, Path(plan.work), deadline, plan.rehearsal)


# --- the gate and the warm-up ---------------------------------------------------------------------------------------

def tiling_count(plan: Plan) -> int | None:
    """How many tilings the kernel's autotuners try at the plan's dtype and head size; None where they cannot be
    pinned (the kernel's launch module renamed what kernel_tilings reads)."""
    import torch

    try:
        return kernel_tilings.tiling_count(plan.head_dim, getattr(torch, plan.dtype))
    except kernel_tilings.TilingsUnknown:
        return None


def gate_check(row: dict, plan: Plan, deadline: float) -> dict:
    """Stage gate: one case in one dQ design at every tiling (gpu_gate.check)."""
    design = DESIGNS[row["design"]]
    return gpu_gate.check(row["gate"], (row["batch"], row["heads"], row["n"]), plan.head_dim, plan.dtype,
                          plan.device, design.select, design.deterministic, tiling_count(plan), deadline)


def warm_unit(row: dict, index: int, plan: Plan) -> list:
    """Compile the row's kernels at its `index`-th tiling without launching them: the row's forward and backward
    with every launch a warmup (kernel_tilings). The (kernel, seconds) compiled."""
    import torch

    with kernel_tilings.pinned_tiling(index), kernel_tilings.compile_only() as compiled:
        if "gate" in row:
            qkv, rel, keep = gpu_gate.problem(row["gate"], row["batch"], row["heads"], row["n"], plan.head_dim,
                                              plan.device)
            select = DESIGNS[row["design"]].select
            weights = torch.ones(row["batch"], row["heads"], row["n"], plan.head_dim, dtype=torch.float64,
                                 device=plan.device)
            with select() if select is not None else contextlib.nullcontext():
                gpu_gate.kernel_call(qkv, rel, keep, getattr(torch, plan.dtype), weights)
        else:
            attention_step(row, plan)[0]()
    return compiled


def warm(plan: Plan, worker: int, workers: int) -> int:
    """One warm-up process: its share of warm_units (every `workers`-th, from its own index), one line each."""
    tilings = tiling_count(plan)
    if tilings is None:
        print(f"warm {worker}: nothing to do: the kernel's tilings cannot be pinned", flush=True)
        return 0
    units = warm_units(plan, tilings)[:plan.warm_limit][worker::workers]
    start = time.time()
    for row, index in units:
        began = time.time()
        try:
            compiled = warm_unit(row, index, plan)
            said = f"{len(compiled)} kernels in {time.time() - began:.1f} s"
        except Exception as error:
            said = f"failed: {one_line(error)}"
        print(f"warm {worker}: {describe(row)} tiling {index}: {said}", flush=True)
    print(f"warm {worker}: done, {len(units)} units in {time.time() - start:.0f} s", flush=True)
    return 0


# --- the tests ----------------------------------------------------------------------------------------------------

def test_files() -> list[str]:
    return sorted({str(path.relative_to(ROOT)) for pattern in TEST_GLOBS for path in ROOT.glob(pattern)})


# the packages the call relies on, by import name: the image's, and the kit's wheels (benchmarks/real_scale.py's
# WHEELS) with what `datasets` takes from the image
PACKAGES = ("torch", "triton", "transformers", "tokenizers", "datasets", "dill", "multiprocess", "pyarrow", "fsspec",
            "pytest", "xdist")


def package_versions(row: dict, plan: Plan, deadline: float) -> dict:
    """Each package imported (in a process of its own: an import that breaks cannot break the stage), its version
    or its error; the kit's wheels named."""
    script = ("import importlib, json, sys\nfound = {}\nfor name in sys.argv[1:]:\n    try:\n"
              "        found[name] = str(getattr(importlib.import_module(name), '__version__', 'no __version__'))\n"
              "    except Exception as error:\n"
              "        found[name] = 'import failed: ' + ' '.join(f'{type(error).__name__}: {error}'.split())[:160]\n"
              "print(json.dumps(found))")
    done = subprocess.run([sys.executable, "-c", script, *PACKAGES], capture_output=True, text=True, cwd=ROOT,
                          timeout=max(deadline - time.time(), 1))
    if done.returncode != 0:
        return {"error": f"failed: the import check exited {done.returncode}: {done.stderr.strip()[-300:]}"}
    versions = json.loads(done.stdout.strip().splitlines()[-1])
    wheels = sorted(path.name for path in (ROOT / ".gpu-kit/wheels").glob("*.whl"))
    broken = [name for name, said in versions.items() if said.startswith("import failed")]
    print("gpu_session: tests: packages: " + ", ".join(f"{name} {said}" for name, said in versions.items()),
          flush=True)
    return {"versions": versions, "kit_wheels": wheels or "none (no .gpu-kit/wheels here)", "import_failed": broken}


def selection_command(plan: Plan, files: list[str], listing: Path, outcomes: Path) -> list[str]:
    """pytest collecting the tests a GPU runs (cuda_selection.py) into `listing`: on a GPU the run itself, every
    test of it (no -x: one failure must not hide the others'), each outcome into `outcomes` as it ends; on a CPU a
    collection as a GPU would make it."""
    options = ["-p", "cuda_selection", "--cuda-selection", "--selection-file", str(listing)]
    if plan.rehearsal:
        return [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *options,
                "--as-cuda", *files]
    # several processes compile Triton's kernels side by side where pytest-xdist is installed (the GPU image)
    workers = ["-n", "8"] if importlib.util.find_spec("xdist") else []
    return [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfE", *workers, *options,
            "--outcomes-file", str(outcomes), *files]


def read_outcomes(outcomes: Path, selection: list[str]) -> dict:
    """What the outcomes file says: how many tests passed and skipped, each failure with its message, and the tests
    of the selection that did not end (stopped at the deadline)."""
    lines = [json.loads(line) for line in outcomes.read_text().splitlines()] if outcomes.exists() else []
    ended = {line["test"] for line in lines}
    return {"passed": sum(line["outcome"] == "passed" for line in lines),
            "skipped": sum(line["outcome"] == "skipped" for line in lines),
            "failures": [{"test": line["test"], "when": line["when"], "message": line.get("message", "")}
                         for line in lines if line["outcome"] == "failed"],
            "not_run": [name for name in selection if name not in ended]}


def pytest_run(command: list[str], deadline: float) -> tuple[int, str]:
    """The command's exit status and output; killed at the deadline (status -SIGKILL)."""
    print("$", " ".join(command[1:]), flush=True)
    path = os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]))  # the plugin
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True, env={**os.environ, "PYTHONPATH": path}) as proc:
        try:
            output, _ = proc.communicate(timeout=max(deadline - time.time(), 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
    print(output, flush=True)
    return proc.returncode, output


def run_tests(row: dict, plan: Plan, deadline: float) -> dict:
    """The kernel's tests a GPU runs, the bars' first, every one (each outcome recorded as it ends), stopped at the
    deadline. On a GPU one run that names its selection as it collects; in the rehearsal the GPU's selection is
    resolved from the tests' marks, then its first plan.tests_limit tests run here under the interpreter (those a GPU
    alone runs skip)."""
    files = test_files()
    if not files:
        return {"error": f"not measured: no test files match {', '.join(TEST_GLOBS)}"}
    listing = Path(plan.work or tempfile.gettempdir()) / "tests.selection"
    outcomes = listing.with_name("tests.outcomes")
    listing.unlink(missing_ok=True)
    outcomes.unlink(missing_ok=True)
    start = time.time()
    status, output = pytest_run(selection_command(plan, files, listing, outcomes), deadline)
    selection = listing.read_text().split() if listing.exists() else []
    result = {"files": files, "selection": selection}
    print(f"gpu_session: tests: the GPU's selection, {len(selection)} tests, the bars' first: "
          + (", ".join(name.split("::", 1)[-1] for name in selection) or "none"), flush=True)
    if plan.rehearsal and selection and status == 0:
        ran = selection[:plan.tests_limit] if plan.tests_limit else selection
        result["rehearsed"] = ran
        status, output = pytest_run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfE",
                                     "-p", "cuda_selection", "--bars-first", "--outcomes-file", str(outcomes), *ran],
                                    deadline)
    seconds = round(time.time() - start, 1)
    result["seconds"] = seconds
    result.update(read_outcomes(outcomes, result.get("rehearsed", selection)))
    for failure in result["failures"]:
        print(f"gpu_session: tests: FAILED {failure['test']}: {' '.join(failure['message'].split())[:200]}",
              flush=True)
    if status == -signal.SIGKILL:
        counts = {"passed": result["passed"], "failed": len(result["failures"]), "skipped": result["skipped"]}
        so_far = ", ".join(f"{count} {word}" for word, count in counts.items() if count) or "nothing"
        return {**result, "error": f"not measured: stopped at the stage's time limit after {seconds:.0f} s, "
                                   f"{so_far} by then"}
    lines = [line for line in output.splitlines() if line.strip()]
    result = {**result, "rc": status, "result": lines[-1].strip("= ") if lines else "no output"}
    print(f"gpu_session: tests: {result['result']} (exit {status})", flush=True)
    return result


def run_test_row(row: dict, plan: Plan, deadline: float) -> dict:
    return package_versions(row, plan, deadline) if row["tests"] == "packages" else run_tests(row, plan, deadline)


STAGES = {"gate": (gate_rows, gate_check), "kernels": (kernel_rows, device_time), "train": (train_rows, train_step),
          "tests": (test_rows, run_test_row), "host": (host_rows, host_time), "flex": (flex_rows, device_time)}


# --- a stage ------------------------------------------------------------------------------------------------------

def key(row: dict) -> tuple:
    return tuple(row.get(name) for name in SPEC)


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text}"[:240]


def context_lost(plan: Plan) -> bool:
    if plan.device != "cuda":
        return False
    import torch

    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").sum().item()
        return False
    except Exception:  # whatever this torch calls the sticky CUDA error
        return True


def machine(plan: Plan) -> str:
    where = "cuda" if plan.device == "cuda" else "CPU (rehearsal, TRITON_INTERPRET=1)"
    return harness.machine_line(where, packages=("torch", "triton"), threads=False, extra=(plan.dtype,))


KERNEL_MODULES = ("convattn.attention.relative.triton_attention", "convattn.attention.relative.triton")


def autotuned() -> list[str]:
    """The tilings the kernel's autotuners chose in this process (on a GPU; none before the kernel ran); "unknown"
    where the kernel's module no longer says (its rework may move or rename `autotuned_configs`)."""
    for name in KERNEL_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        if callable(getattr(module, "autotuned_configs", None)):
            try:
                return [str(line) for line in module.autotuned_configs()]
            except Exception as error:
                return [f"unknown ({one_line(error)})"]
    return ["unknown (the kernel's module has no autotuned_configs)"]


def run_stage(stage: str, plan: Plan, out: Path, deadline: float) -> int:
    rows_of, measure_row = STAGES[stage]
    file = out / f"{stage}.json"
    rows = load(out, stage)[0]
    done = {key(row) for row in rows}
    broken = {row["arm"] for other in STAGES for row in load(out, other)[0] if row.get("context_lost")}
    header = {"stage": stage, "machine": machine(plan)}
    # the row being measured, in the session's scratch folder (not among the files that come back): where the
    # process dies in it (a crash in the kernel, say), the session starts the stage again past it
    current = Path(plan.work) / f"{stage}.current" if plan.work else None
    died = json.loads(current.read_text()) if current is not None and current.exists() else None
    unverified = gate_verdict(out, plan) if stage != "gate" else None
    for spec in rows_of(plan):
        if key(spec) in done:
            continue
        result = {}
        if died is not None and key(died) == key(spec):
            result = {"error": "failed: the stage's process died measuring it (its exit status: session.log)"}
        elif spec.get("arm") in broken:
            result = {"error": f"skipped: the {spec['arm']} arm broke the CUDA context earlier"}
        elif time.time() >= deadline:
            result = {"error": "not measured: the stage ran out of time"}
        else:
            if current is not None:
                write_atomic(current, json.dumps(spec))
            try:
                result = measure_row(spec, plan, deadline)
            except Exception as error:  # a failing arm is a result; the others go on
                result = {"error": f"failed: {one_line(error)}", "traceback": traceback.format_exc()[-1500:]}
                if context_lost(plan):
                    result["context_lost"] = True
            finally:
                if plan.collect:
                    gc.collect()
                if plan.device == "cuda" and not result.get("context_lost"):
                    import torch

                    torch.cuda.empty_cache()
        if unverified and (stage == "train" or ARMS.get(spec.get("arm"), ARMS["sdpa"]).kind == "kernel"):
            result["unverified"] = unverified
        rows.append({**spec, **result})
        print(stage, json.dumps({k: v for k, v in rows[-1].items() if k not in ("traceback", "kernels")}),
              flush=True)
        if stage != "tests":  # the tests stage says its own
            print(f"gpu_session: {stage}: {describe(spec)}: {outcome(rows[-1], plan)}", flush=True)
        write_atomic(file, json.dumps({**header, "autotuned": autotuned(), "rows": rows}, indent=1) + "\n")
        if current is not None:
            current.unlink(missing_ok=True)
        if result.get("context_lost"):
            return RESTART
    return 0


def gate_verdict(out: Path, plan: Plan) -> str | None:
    """None where the gate passed every case; else why the kernel and training rows are unverified."""
    return gpu_gate.verdict(load(out, "gate")[0], len(gate_rows(plan)))


def outcome(row: dict, plan: Plan) -> str:
    """A measured row's result in a few words."""
    if "error" in row:
        said = row["error"][:160]
    elif "gate" in row:
        worst = max((error for tiling in row["tilings"].values() for error in tiling["errors"].values()),
                    default=None)
        said = f"{row['verdict']}, {len(row['tilings'])} tilings, largest error {worst:.1e}" if worst is not None \
            else row["verdict"]
        said += f" ({row['failed']})" if row.get("failed") else ""
    elif "tokens_per_s" in row:
        said = f"{row['tokens_per_s']:,.0f} tokens/s"
        said += f", {row['not_graphed']}" if row.get("not_graphed") else ""
    else:
        field = time_field(plan)
        said = f"{row[field]:.3f} ms ({'device' if field == 'device_ms' else 'wall'})" if row.get(field) else "-"
    return said + (" [unverified]" if row.get("unverified") else "")


# --- the session --------------------------------------------------------------------------------------------------

def copy_lines(source, sink, echo) -> threading.Thread:
    """A thread that writes each line of `source` (a stage's output) to `sink` (session.log), and to `echo` too where
    it begins "gpu_session: " (what the stage says for the call's output)."""
    def copy():
        for line in source:
            sink.write(line)
            sink.flush()
            if line.startswith("gpu_session: "):
                echo.write(line)
                echo.flush()
    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def start_warmup(plan: Plan, out: Path, work: Path, rehearse: bool) -> list[subprocess.Popen]:
    """The warm-up's processes (warm), each writing its lines to its log in `work`."""
    processes = []
    for worker in range(plan.warm_workers):
        command = [sys.executable, __file__, "--warm", f"{worker}/{plan.warm_workers}", "--out", str(out),
                   "--work", str(work)] + ["--rehearse"] * rehearse
        with (work / f"warm-{worker}.log").open("w") as sink:
            processes.append(subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                              start_new_session=True))
    return processes


def stop_warmup(processes: list[subprocess.Popen], work: Path, started: float, sink) -> str:
    """Stops what is still compiling; its lines go to session.log; one line of what it did."""
    stopped = 0
    for proc in processes:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            stopped += 1
        proc.wait()
    lines = [line for log in sorted(work.glob("warm-*.log")) for line in log.read_text().splitlines()]
    sink.write("".join(f"{line}\n" for line in lines))
    units = [line for line in lines if " tiling " in line]
    failed = [line for line in units if ": failed: " in line]
    said = (f"gpu_session: warm-up: {len(units) - len(failed)} units compiled by {len(processes)} processes in "
            f"{time.time() - started:.0f} s")
    said += f", {len(failed)} failed (session.log: {failed[0][:160]})" if failed else ""
    said += f"; {stopped} processes stopped unfinished" if stopped else "; all finished"
    return said


def session(plan: Plan, out: Path, rehearse: bool) -> int:
    for stage in [*STAGES, "summary"]:
        (out / f"{stage}.{'md' if stage == 'summary' else 'json'}").unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_session-"))  # the train stage's corpus, cache and runs
    log = out / "session.log"
    # the budgets count from the call's start: gpu_session.sh's, before it installed the kit's wheels
    start = end = min(float(os.environ.get("GPU_SESSION_STARTED") or time.time()), time.time())
    # every process of the call: the autotuner's picks into Triton's cache (TRITON_CACHE_DIR, else ~/.triton/cache),
    # where the warm-up compiles too; read again by any later process (the interpreter keeps none)
    os.environ["TRITON_CACHE_AUTOTUNING"] = "1"
    heading = "the GPU call's plan (the rehearsal runs it at tiny shapes)" if rehearse else "the call's plan"
    print(f"gpu_session: {heading}:", *(f"gpu_session: plan: {line}" for line in plan_lines(GPU if rehearse
                                                                                            else plan)),
          sep="\n", flush=True)
    warmup = start_warmup(plan, out, work, rehearse)
    try:
        with log.open("w") as sink:
            for stage, budget in plan.budgets.items():
                end += budget
                status, restarts = RESTART, 0
                if time.time() >= end - SLACK:
                    print(f"gpu_session: stage {stage}: not started, its time is gone", flush=True)
                while again(status, restarts) and time.time() < end - SLACK:
                    restarts += status != RESTART
                    started = time.time()
                    command = [sys.executable, __file__, "--stage", stage, "--deadline", f"{end - SLACK:.0f}",
                               "--out", str(out), "--work", str(work)] + ["--rehearse"] * rehearse
                    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True) as proc:
                        copying = copy_lines(proc.stdout, sink, sys.stdout)
                        try:
                            status = proc.wait(timeout=end - time.time())
                        except subprocess.TimeoutExpired:
                            os.killpg(proc.pid, signal.SIGKILL)
                            status = f"stopped at its time limit ({proc.wait()})"
                        copying.join(timeout=10)
                    line = f"gpu_session: stage {stage}: exit {status} after {time.time() - started:.0f} s"
                    print(line, file=sink, flush=True)
                    if status not in (0, RESTART):  # what the stage said last (a traceback, say) comes back too
                        print("\n".join(f"  | {said}" for said in log.read_text().splitlines()[-12:]))
                    print(line, flush=True)
                if stage == "kernels" and warmup:  # what it has not compiled by now, the stages compile themselves
                    said = stop_warmup(warmup, work, start, sink)
                    warmup = []
                    print(said, file=sink, flush=True)
                    print(said, flush=True)
            if warmup:
                print(stop_warmup(warmup, work, start, sink), file=sink, flush=True)
    finally:
        for proc in warmup:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)
    for staged in out.glob(".*.tmp"):  # what a stage stopped in the middle of writing: not one of the files
        staged.unlink()
    text, short = summary(out, plan)
    write_atomic(out / "summary.md", text)
    record(out, plan, harness.command_line(script="benchmarks/gpu_session.sh", program="bash"))
    print(f"gpu_session: {time.time() - start:.0f} s in all; files in {out}: "
          f"{', '.join(sorted(p.name for p in out.iterdir()))}\n")
    print(short, flush=True)
    return 0


def again(status, restarts: int) -> bool:
    """Whether the session starts a stage (again) after its process ended with `status`: not yet started, after an
    arm broke the CUDA context, or (RESTARTS times at most) after the process died."""
    died = isinstance(status, int) and status not in (0, RESTART)
    return status == RESTART or (died and restarts < RESTARTS)


# --- the summary --------------------------------------------------------------------------------------------------

def load(out: Path, stage: str) -> tuple[list[dict], str | None]:
    """A stage's rows and machine, from its file in `out` (none where it did not run)."""
    file = out / f"{stage}.json"
    if not file.exists():
        return [], None
    data = json.loads(file.read_text())
    return data["rows"], data["machine"]


def tilings(out: Path) -> list[str]:
    """What the kernel's autotuners chose, in every stage."""
    files = [out / f"{stage}.json" for stage in STAGES]
    return sorted({line for file in files if file.exists() for line in json.loads(file.read_text())["autotuned"]})


def planned(out: Path, stage: str, plan: Plan) -> tuple[list[dict], str | None]:
    """A stage's rows in the plan's order, those its file lacks (its process was stopped, or never ran) with
    their reason."""
    rows, machine_name = load(out, stage)
    recorded = {key(row): row for row in rows}
    missing = "not measured: the stage stopped before it" if rows else "not measured: the stage did not run"
    return [recorded.get(key(spec)) or {**spec, "error": missing} for spec in STAGES[stage][0](plan)], machine_name


def cell(row: dict | None, name: str, digits: int = 2) -> str:
    if row is None or "error" in row or row.get(name) is None:
        return "-"
    return f"{row[name]:,.{digits}f}"


def why(row: dict) -> str:
    """A row's reason for having no measurements, in a word ("failed", "skipped", "not measured"); else ""."""
    return row["error"].split(":")[0] if "error" in row else ""


def ratio(row: dict | None, base: dict | None, name: str) -> float | None:
    if not row or not base or row.get(name) is None or not base.get(name):
        return None
    return row[name] / base[name]


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(header: str, lines: list[str]) -> list[str]:
    return [header, "|---" * header.count(" | ") + "|---|", *lines]


def shape_name(row: dict) -> str:
    return f"{row['batch']} x {row['heads']} x {row['n']:,}"


def time_field(plan: Plan) -> str:
    """The kernels stage's time: the device's kernel sums on a GPU; the rehearsal's stand-in, the wall time."""
    return "wall_ms" if plan.rehearsal else "device_ms"


class Bars:
    """Each bar's verdict, one line each: pass, fail, or not measured; "(unverified)" beside where the gate did not
    pass."""

    def __init__(self):
        self.lines: list[str] = []
        self.figures: list[dict] = []
        self.counts = Counter()

    def add(self, name: str, where: str, value: float | None, limit: float, at_most: bool,
            unverified: bool = False) -> None:
        if value is None:
            verdict = "not measured"
        else:
            verdict = "pass" if (value <= limit if at_most else value >= limit) else "fail"
        self.counts[verdict] += 1
        self.counts["unverified"] += unverified and value is not None
        bound = f"{'<=' if at_most else '>='} {limit:g}x"
        said = f"{verdict} (unverified)" if unverified and value is not None else verdict
        self.lines.append(f"| {name} | {where} | {times(value)} | {bound} | {said} |")
        self.figures.append({"bar": name, "where": where, "ratio": value, "bound": bound, "verdict": said})

    def text(self) -> list[str]:
        total = sum(self.counts[word] for word in ("pass", "fail", "not measured"))
        said = f"Bars passed: {self.counts['pass']} of {total}"
        if self.counts["fail"] or self.counts["not measured"]:
            said += f" ({self.counts['fail']} failed, {self.counts['not measured']} not measured)"
        if self.counts["unverified"]:
            said += f"; {self.counts['unverified']} measured on rows the gate did not verify"
        return [*table("| bar | where | measured | bar | verdict |", self.lines), "", said + "."]


def unverified(*rows: dict | None) -> bool:
    return any(row is not None and row.get("unverified") for row in rows)


def kernel_bars(bars: Bars, rows: list[dict], plan: Plan) -> None:
    by_key = {key(row): row for row in rows}
    field = time_field(plan)
    for arm, limit, smallest in KERNEL_BARS:
        least = plan.long if smallest == "long" else smallest
        for batch, heads, n in sorted(plan.shapes, key=lambda shape: shape[2] < plan.long):
            if n < least:
                continue
            base = by_key.get(key(dict(batch=batch, heads=heads, n=n, arm=ARMS[arm].baseline)))
            for design in plan.designs:
                row = by_key.get(key(dict(batch=batch, heads=heads, n=n, arm=arm, design=design)))
                where = f"{batch} x {heads} x {n:,}" + (f", dQ {design}" if len(plan.designs) > 1 else "")
                bars.add(BAR_NAMES[arm], where, ratio(row, base, field), limit, True, unverified(row))


def train_bars(bars: Bars, rows: list[dict], plan: Plan) -> None:
    by_key = {key(row): row for row in rows}
    for batch in plan.train.batches:
        for mode in TOKENS_BARS:
            row = by_key.get(key(dict(mode=mode, batch=batch, arm="composite")))
            base = by_key.get(key(dict(mode=mode, batch=batch, arm="absolute")))
            graphed = not any((r or {}).get("not_graphed") for r in (row, base))
            where = f"batch {batch}, {mode}" + ("" if graphed else ", not graphed")
            bars.add("training step: composite's tokens/s vs absolute's", where,
                     ratio(row, base, "tokens_per_s"), TOKENS_BARS[mode], False, unverified(row, base))
            bars.add("training step: composite's peak memory vs absolute's", where,
                     ratio(row, base, "peak_mib"), MEMORY_BAR, True, unverified(row, base))


def kernel_table(rows: list[dict], plan: Plan, shapes: tuple | None = None) -> list[str]:
    by_key = {key(row): row for row in rows}
    field = time_field(plan)
    shapes = list(shapes or plan.shapes)
    lines = []
    for row in sorted(rows, key=lambda r: (shapes.index((r["batch"], r["heads"], r["n"])),
                                           list(ARMS).index(r["arm"]),
                                           plan.designs.index(r["design"]) if r.get("design") in plan.designs
                                           else -1)):
        arm = ARMS[row["arm"]]
        base = by_key.get(key({**row, "arm": arm.baseline, "design": None})) if arm.baseline else None
        top = "; ".join(f"{k['name'][:70]} {k['ms']:.3f}" for k in row.get("kernels", [])[:2])
        measured = why(row) or cell(row, field, 3)
        lines.append(f"| {shape_name(row)} | {row['arm']} | {row.get('design') or '-'} | {arm.baseline or '-'} | "
                     f"{measured} | {times(ratio(row, base, field))} | {cell(row, 'launches', 0)} | {top or '-'} |"
                     + (" unverified |" if row.get("unverified") else " |"))
    return table(f"| batch x heads x n | arm | dQ | against | {'wall' if plan.rehearsal else 'device'} ms | ratio | "
                 "launches | top kernels (ms per call) | note |", lines)


def gate_table(rows: list[dict]) -> list[str]:
    lines = []
    for row in rows:
        tilings = row.get("tilings", {})
        worst = max((error for tiling in tilings.values() for error in tiling["errors"].values()), default=None)
        sdpa = max(row.get("sdpa_errors", {}).values(), default=None)
        bits = {tiling.get("same_bits") for tiling in tilings.values()} - {None}
        lines.append(f"| {row['gate']} | {shape_name(row)} | {row['design']} | "
                     f"{row.get('verdict') or why(row)} | {len(tilings)} | "
                     f"{'-' if worst is None else f'{worst:.1e}'} | {'-' if sdpa is None else f'{sdpa:.1e}'} | "
                     f"{'-' if not bits else 'yes' if bits == {True} else 'no'} | "
                     f"{(row.get('failed') or row.get('error') or '')[:160]} |")
    return table("| case | batch x heads x n | dQ | verdict | tilings | largest error | SDPA's largest | same bits "
                 "twice | what failed |", lines)


def sdpa_kernels(rows: list[dict]) -> list[str]:
    """The kernels each SDPA arm ran, once per distinct list."""
    seen = defaultdict(list)
    for row in rows:
        if ARMS[row["arm"]].kind == "sdpa" and row.get("kernels"):
            names = ", ".join(f"`{k['name'][:120]}`" for k in row["kernels"] if k["ms"] > 0)
            seen[(row["arm"], names)].append(shape_name(row))
    return [f"- {arm} ({'; '.join(shapes)}): {names}" for (arm, names), shapes in seen.items()] or [
        "- none recorded (no SDPA arm ran on a GPU)"]


def host_table(rows: list[dict]) -> list[str]:
    lines = []
    for row in rows:
        bound = "-"
        if row.get("device_ms") is not None and row.get("host_ms") is not None:
            bound = "launch-bound" if row["host_ms"] > row["device_ms"] else "device-bound"
        arm = row["arm"] + (", through the operators" if row.get("path") == "operators" else "")
        lines.append(f"| {shape_name(row)} | {arm} | {why(row) or cell(row, 'host_ms', 3)} | "
                     f"{cell(row, 'launches', 0)} | "
                     f"{cell(row, 'host_us_per_launch', 1)} | {cell(row, 'wall_ms', 3)} | "
                     f"{cell(row, 'device_ms', 3)} | {bound} |")
    return table("| batch x heads x n | arm | host ms per call | launches | host us per launch | wall ms | "
                 "device ms | verdict |", lines)


def train_note(row: dict) -> str:
    """What a training row's numbers need beside them: not graphed (and why), graph breaks, recompilation, a stop,
    the gate."""
    notes = [row.get("not_graphed") or "", row.get("recompiled") or "", row.get("stopped") or ""]
    if row.get("graph_breaks") and not row.get("not_graphed"):
        notes.append(f"{row['graph_breaks']} graph breaks")
    notes.append("unverified" if row.get("unverified") else "")
    return "; ".join(note for note in notes if note)[:240]


def train_table(rows: list[dict]) -> list[str]:
    by_key = {key(row): row for row in rows}
    lines = []
    for row in rows:
        base = by_key.get(key({**row, "arm": "absolute"}))
        busy = "-" if row.get("busy") is None else f"{row['busy']:.0%}"
        measured = why(row) or cell(row, "tokens_per_s", 0)
        lines.append(f"| {row['mode']} | {row['batch']} | {row['arm']} | {measured} | "
                     f"{times(ratio(row, base, 'tokens_per_s'))} | {cell(row, 'ms_per_step', 1)} | "
                     f"{cell(row, 'peak_mib', 0)} | {times(ratio(row, base, 'peak_mib'))} | {busy} | "
                     f"{cell(row, 'first_step_s', 1)} | {train_note(row)} |")
    return table("| mode | batch | arm | tokens/s | vs absolute | ms per step | peak MiB | vs absolute | device busy | "
                 "s to step 1 | note |", lines)


def tests_lines(rows: list[dict]) -> list[str]:
    lines = []
    for row in rows:
        if row["tests"] == "packages":
            if "versions" in row:
                lines.append("- packages: " + ", ".join(f"{name} {said}" for name, said in row["versions"].items()))
                wheels = row["kit_wheels"]
                lines.append(f"- the kit's wheels: {', '.join(wheels) if isinstance(wheels, list) else wheels}")
            else:
                lines.append(f"- packages: {row['error']}")
            continue
        said = f"{row['result']} (exit {row['rc']})" if "rc" in row else row["error"]
        selection = row.get("selection") or []
        ran = row.get("rehearsed")
        where = f", the first {len(ran)} run here" if ran is not None else ""
        lines.append(f"- the kernel's tests a GPU runs ({len(selection)} of {', '.join(row.get('files', []))}, the "
                     f"bars' first{where}): {said}")
        for failure in row.get("failures", []):
            where = "" if failure["when"] == "call" else f" (its {failure['when']})"
            lines.append(f"  - failed: `{failure['test']}`{where}: {' '.join(failure['message'].split())[:300]}")
        if row.get("not_run"):
            lines.append(f"  - not run ({len(row['not_run'])}): "
                         + ", ".join(f"`{name.split('::', 1)[-1]}`" for name in row["not_run"]))
        lines.append(f"  - the selection (tests.json names each): {len(selection)} tests")
    return lines


def measured(out: Path, plan: Plan) -> tuple[dict, str, Bars]:
    """Every stage's rows in the plan's order, the machine they ran on, and the bars' verdicts."""
    stages = {stage: planned(out, stage, plan) for stage in STAGES}
    bars = Bars()
    kernel_bars(bars, stages["kernels"][0], plan)
    train_bars(bars, stages["train"][0], plan)
    return stages, next((name for _, name in stages.values() if name), "no stage ran"), bars


def record(out: Path, plan: Plan, command: str) -> None:
    """The session's figures as one row of benchmarks/results/gpu_session.jsonl: each bar's measured ratio and
    verdict, then every stage's measured rows (the kernels' names and the gate's per-tiling errors stay in the
    stages' files). A rehearsal's row goes beside its own files: CPU figures are no GPU session's results."""
    stages, machine_name, bars = measured(out, plan)
    path = out / "gpu_session.jsonl" if plan.rehearsal else None
    with harness.Run("gpu_session", machine=machine_name, command=command, path=path,
                     gate=gate_verdict(out, plan) or "passed") as run:
        for figure in bars.figures:
            run.add(stage="bars", **figure)
        for stage, (rows, _) in stages.items():
            for row in rows:
                if "error" not in row:
                    run.add(stage=stage, **{k: v for k, v in row.items() if k not in ("traceback", "kernels",
                                                                                          "tilings")})


def summary(out: Path, plan: Plan) -> tuple[str, str]:
    """summary.md's text, and its short part: the gate, the tests, the bars with their verdicts, the stages' tables,
    what failed."""
    stages, machine_name, bars = measured(out, plan)
    problems = Counter(f"{stage}: {row['error']}" for stage, (rows, _) in stages.items()
                       for row in rows if "error" in row)
    stand_in = "; in the rehearsal the wall time under the profiler stands in" if plan.rehearsal else ""
    gate = gate_verdict(out, plan)
    short = [
        f"# GPU session: {machine_name}", "",
        f"`bash benchmarks/gpu_session.sh`: attention forward + backward, {plan.head_dim} channels a head, padding "
        f"1/8 of one row, attention dropout {DROPOUT:g} where named; the training step through `convattn pretrain`.",
        "",
        "## Gate (the kernel against SDPA and float64 before any timing)", "",
        f"{'Passed: the kernel and training rows are verified.' if gate is None else gate[0].upper() + gate[1:]}",
        "", *gate_table(stages["gate"][0]), "",
        f"## Bars on {machine_name.split(', torch')[0]}", "",
        f"Attention: the device's time per forward + backward (the profiler's kernel sums{stand_in}) over its "
        "SDPA baseline's. Training step: composite's over absolute's, the same batch and mode.", "",
        *bars.text(), "",
        "## Tests", "", *(tests_lines(stages["tests"][0]) or ["- not run"]), "",
        "## Device time per call (stage kernels)", "", *kernel_table(stages["kernels"][0], plan), "",
        "SDPA's kernels:", "", *sdpa_kernels(stages["kernels"][0]), "",
        "## Training step: `convattn pretrain`, chang2021-small recipe (stage train; tokens that are not padding, "
        "per second of the timed steps after the warm-up; device busy: kernel time over wall time; s to step 1: from "
        "the start of training, its first evaluation and the compilation included; not graphed: a graphs row with "
        "cudagraph skips or graph breaks)", "",
        *train_table(stages["train"][0]), "",
        "## Host time per call and per launch (stage host; launch-bound: the host issues the call slower than the "
        "device runs it)", "", *host_table(stages["host"][0]), "",
        "## FlexAttention without a score_mod (stage flex: PyTorch's own Triton kernels, the Triton floor)", "",
        *kernel_table(stages["flex"][0], plan, (plan.flex_shape,)), "",
        "## Failed, skipped or not measured", "",
        *([f"- {count} x {text[:200]}" for text, count in problems.most_common(12)] or ["- nothing"]),
        *[f"- and {len(problems) - 12} other reasons: the stages' files"] * (len(problems) > 12),
    ]
    text = "\n".join(short) + "\n"
    every = [f"- {describe(row)}: " + (", ".join(f"`{k['name']}` {k['ms']:.4f} ms x {k['calls']:g}"
                                                 for k in row.get("kernels", [])) or "-")
             for stage in ("kernels", "flex") for row in stages[stage][0] if "error" not in row]
    tuned = [f"- {line}" for line in tilings(out)] or ["- none (no kernel ran on a GPU)"]
    return text + "\n".join(["", "## Every arm's kernels (per call)", "", *(every or ["- none"]), "",
                             "## The kernel's autotuned tilings", "", *tuned]) + "\n", text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rehearse", action="store_true", help="on CPU with tiny shapes (set TRITON_INTERPRET=1)")
    parser.add_argument("--stage", choices=[*STAGES, "summary"], help="run this stage alone (default: the session)")
    parser.add_argument("--deadline", type=float, help="with --stage: the Unix time by which it stops measuring")
    parser.add_argument("--out", type=Path, help="the results' folder (default: $OUT, else benchmarks/results/"
                                                 "gpu_session, or a temporary folder when rehearsing)")
    parser.add_argument("--work", type=Path, help="with --stage train: its scratch folder (default: a new one)")
    parser.add_argument("--warm", metavar="I/N", help="be the I-th of N warm-up processes (the session starts them)")
    args = parser.parse_args()
    plan = REHEARSAL if args.rehearse else GPU
    if args.rehearse and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--rehearse runs the kernel under Triton's interpreter: set TRITON_INTERPRET=1 (gpu_session.sh "
                     "does)")
    if args.warm:
        worker, workers = (int(part) for part in args.warm.split("/"))
        if args.rehearse:
            import torch

            torch.set_num_threads(1)
        return warm(dataclasses.replace(plan, work=str(args.work or "")), worker, workers)
    if not args.rehearse and args.stage in (None, *STAGES):
        import torch

        if not torch.cuda.is_available():
            parser.error("needs a CUDA GPU (or --rehearse)")
    if args.rehearse and args.stage in STAGES and args.stage != "tests":
        import torch

        torch.set_num_threads(1)  # tiny shapes: threads only wait on each other, and on whatever else runs
    if args.stage in STAGES and args.deadline is None:
        parser.error("--stage needs --deadline")
    out = args.out or Path(os.environ.get("OUT") or (Path(tempfile.gettempdir()) / "gpu_session_rehearsal"
                                                       if args.rehearse else ROOT / "benchmarks/results/gpu_session"))
    out.mkdir(parents=True, exist_ok=True)
    if args.stage == "summary":
        text, short = summary(out, plan)
        write_atomic(out / "summary.md", text)
        record(out, plan, harness.command_line())
        print(short)
        return 0
    if args.stage:
        plan = dataclasses.replace(plan, work=str(args.work or tempfile.mkdtemp(prefix="gpu_session-")))
        return run_stage(args.stage, plan, out, args.deadline)
    return session(plan, out, args.rehearse)


if __name__ == "__main__":
    sys.exit(main())
