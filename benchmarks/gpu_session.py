"""One GPU session in one command (issues 37 and 47): what a user of the fused relative-attention kernel meets, in
four stages of priority order, each time-boxed and writing its file as soon as it finishes a row:

  tests    (90 s at most) the kernel's CUDA tests (tests/attention/relative/test_triton*.py, or the triton/
           folder beside them), stopping at the first failure (pytest -x)
  kernels  the device's time per forward + backward of attention alone: the sum of the device's kernels, copies and
           memsets under torch.profiler (not the wall clock), at batch x heads x n = 32 x 4 x 512, 128 x 4 x 512,
           8 x 4 x 2,048 and 2 x 12 x 8,192 (64 channels a head, bf16): the kernel plain, + dropout 0.1, + padding
           (1/8 of one row, and the dropout), + the row table (fixed + dynamic_query: composite), + the key table
           (dynamic_key), and composite+key, against SDPA without a mask (its flash backend, without and with the
           dropout) and SDPA with the same mask and dropout (the backend it chooses); the names of the kernels
           each arm ran (SDPA's too) are recorded. The bars' rows first, every shape, then the others
  host     the host's time per call (issuing forward + backward, no profiler) and per launch (over the device's
           launches of a profiled call), beside the wall and device time, every arm at 32 x 4 x 512: launch-bound
           where the host issues a call slower than the device runs it
  train    the product's own training step (benchmarks/pretrain_step.py): `convattn pretrain` at the
           chang2021-small recipe's shape in bf16, chang2021-small/composite against chang2021-small/absolute (SDPA)
           and transformers' BertForMaskedLM (SDPA), batch 128 and 512, eager and --compile: tokens/s after the
           warm-up, the allocator's peak, the device's busy share. Needs the kit (.gpu-kit, carried: `datasets`'
           wheels, the recipe's tokenizer, the text); without it the rows say so
  summary  every bar with its verdict (pass / fail) on the named device, the stages' tables: summary.md, printed
           last

An arm that fails (an exception, out of memory) is recorded with its reason and the stage goes on; one that breaks
the CUDA context ends its stage's process, and the session starts the stage again without that arm. A stage that
runs out of time records what it did not measure. A stage continues the rows its file already holds (the session
removes the files first). Files (6 of the device call's 8): session.log, tests.json, kernels.json, host.json,
train.json, summary.md.

    bash benchmarks/gpu_session.sh               # the GPU machine's one call: every stage in under 8 minutes
    bash benchmarks/gpu_session.sh --rehearse    # on CPU: tiny shapes, the kernel under TRITON_INTERPRET=1 (CI)
    bash benchmarks/gpu_session.sh --stage kernels --deadline $(( $(date +%s) + 120 ))    # one stage by hand

Files go to --out: $OUT where set (the GPU machine's folder that comes back), else benchmarks/results/gpu_session
(or a temporary folder when rehearsing).
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
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pretrain_step

# torch, transformers and convattn are imported where a stage measures (seconds each): the session's own process and
# the tests stage's need none of them

ROOT = Path(__file__).resolve().parents[1]
# the kernel's tests, wherever the kernel's rework puts them
TEST_GLOBS = ("tests/attention/relative/test_triton*.py", "tests/attention/relative/triton/**/test_*.py")
# Seconds per stage, in order; a stage may use what the ones before it left. 455 s in all, under the 8 minutes the
# session has on an H100 or H200, Triton's and Inductor's compilation included (the machine's start is not the
# command's).
BUDGETS = {"tests": 90, "kernels": 120, "host": 25, "train": 220}
SLACK = 10  # a stage's own deadline comes this much before its process is stopped
RESTART = 75  # a stage's exit status after an arm broke the CUDA context
RESTARTS = 3  # at most this many times a stage starts again after its process died (a crash in an arm)
SPEC = ("tests", "batch", "heads", "n", "mode", "arm")  # the fields that name a row
DROPOUT = 0.1


@dataclass(frozen=True)
class Arm:
    kind: str  # "sdpa" or "kernel"
    dropout: float
    padding: bool
    terms: tuple[str, ...] = ()
    baseline: str = ""  # the SDPA arm it is measured against


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
}
# (arm, limit, from which n: 0 every shape, else the plan's `long`): device time over its baseline's, at most
KERNEL_BARS = (("plain", 1.15, "long"), ("+dropout", 1.3, 0), ("+row table", 1.35, 0), ("composite+key", 1.6, 0))
BAR_NAMES = {"plain": "plain kernel vs SDPA flash", "+dropout": "kernel + dropout 0.1 vs SDPA flash + dropout",
             "+row table": "composite vs SDPA with the same mask and dropout",
             "composite+key": "composite+key vs SDPA with the same mask and dropout"}
# the training step: composite's tokens/s over absolute's, at least (per mode); its peak over absolute's, at most
TOKENS_BARS, MEMORY_BAR = {"compiled": 0.9, "graphs": 0.9, "eager": 0.8}, 1.1


@dataclass(frozen=True)
class Plan:
    device: str
    dtype: str  # torch's name
    shapes: tuple[tuple[int, int, int], ...]  # (batch, heads, n) of the kernels stage
    host_shapes: tuple[tuple[int, int, int], ...]
    long: int  # the plain kernel's bar holds from this n
    head_dim: int
    warmup: int
    profiled: int  # steps profiled per kernels row
    host_steps: int
    train: pretrain_step.TrainPlan
    tests: str | None = None  # pytest -k (None: every test of the files)
    flash: bool = True  # SDPA without a mask through its flash backend
    work: str = ""  # the train stage's scratch folder (the session's; set by main)

    @property
    def rehearsal(self) -> bool:
        return self.device != "cuda"


GPU = Plan("cuda", "bfloat16", ((32, 4, 512), (128, 4, 512), (8, 4, 2048), (2, 12, 8192)), ((32, 4, 512),),
           long=2048, head_dim=64, warmup=3, profiled=10, host_steps=20, train=pretrain_step.GPU_TRAIN)
# A call of the kernel under the interpreter takes 0.2-0.5 s on CPU at 1 x 1 x 16 (1-5 s at 2 x 2 x 24): one tiny
# shape, one call of each kind
REHEARSAL = Plan("cpu", "float32", ((1, 1, 16),), ((1, 1, 16),), long=0, head_dim=16, warmup=0, profiled=1,
                 host_steps=1, train=pretrain_step.REHEARSAL_TRAIN, tests="cuda", flash=False)


def write_atomic(path: Path, text: str) -> None:
    """`text` into `path`, whole or not at all (a reader never sees half a file)."""
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(text)
    staged.replace(path)


# --- the rows of each stage, in the order they run ---------------------------------------------------------------

def test_rows(plan: Plan) -> list[dict]:
    return [{"tests": "kernel"}]


def kernel_rows(plan: Plan) -> list[dict]:
    """The bars' arms and their baselines at every shape first, then the other arms."""
    def row(shape, arm):
        return dict(zip(("batch", "heads", "n"), shape, strict=True), arm=arm)
    barred = {"sdpa", "sdpa+dropout", "sdpa+padding", *(arm for arm, _, _ in KERNEL_BARS)}
    return ([row(shape, arm) for shape in plan.shapes for arm in ARMS if arm in barred]
            + [row(shape, arm) for shape in plan.shapes for arm in ARMS if arm not in barred])


def host_rows(plan: Plan) -> list[dict]:
    return [dict(zip(("batch", "heads", "n"), shape, strict=True), arm=arm) for shape in plan.host_shapes
            for arm in ARMS]


def train_rows(plan: Plan) -> list[dict]:
    return pretrain_step.rows(plan.train)


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
    from attention_gpu import padded_keep

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
    keep = padded_keep(batch, n, device) if arm.padding else torch.ones(batch, n, dtype=torch.bool, device=device)
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

    def step():
        with dispatch.forced_path("triton") if arm.terms else contextlib.nullcontext():
            out, _ = dispatch.relative_attention(q, k, v, relative, token_mask, dropout_p=arm.dropout,
                                                 attn_implementation=implementation)
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


def device_events(prof) -> list:
    from torch.autograd import DeviceType

    return [e for e in prof.events() if e.device_type == DeviceType.CUDA]


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
    events = device_events(prof)
    result = {"wall_ms": round(wall, 4), "steps": plan.profiled, "device_ms": None, "launches": None}
    if plan.device == "cuda":
        result["device_ms"] = round(sum(e.time_range.elapsed_us() for e in events) / plan.profiled / 1e3, 4)
        result["launches"] = round(len(events) / plan.profiled, 2)
        result["kernels"] = kernel_names(events, plan.profiled)
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
    events = device_events(prof)
    if events:
        result["device_ms"] = round(sum(e.time_range.elapsed_us() for e in events) / steps / 1e3, 4)
        result["launches"] = round(len(events) / steps, 2)
        result["host_us_per_launch"] = round(result["host_ms"] * 1e3 / result["launches"], 2)
    return result


def train_step(row: dict, plan: Plan, deadline: float) -> dict:
    return pretrain_step.measure(row, plan.train, Path(plan.work), deadline, plan.rehearsal)


# --- the tests ----------------------------------------------------------------------------------------------------

def test_files() -> list[str]:
    return sorted({str(path.relative_to(ROOT)) for pattern in TEST_GLOBS for path in ROOT.glob(pattern)})


def run_tests(row: dict, plan: Plan, deadline: float) -> dict:
    """pytest -x on the kernel's test files (with the plan's selection), stopped at the deadline."""
    files = test_files()
    if not files:
        return {"error": f"not measured: no test files match {', '.join(TEST_GLOBS)}"}
    # several processes compile Triton's kernels side by side where pytest-xdist is installed (the GPU image)
    workers = ["-n", "8"] if plan.device == "cuda" and importlib.util.find_spec("xdist") else []
    command = [sys.executable, "-m", "pytest", "-x", "-v", "-p", "no:cacheprovider", "-rfE", *workers, *files,
               *(["-k", plan.tests] if plan.tests else [])]
    print("$", " ".join(command[1:]), flush=True)
    start = time.time()
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        try:
            output, _ = proc.communicate(timeout=max(deadline - start, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
    print(output, flush=True)
    seconds = round(time.time() - start, 1)
    result = {"files": files, "selection": plan.tests, "seconds": seconds}
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    if failed:
        result["first_failure"] = failed[0]
    if proc.returncode == -signal.SIGKILL:
        counts = Counter(re.findall(r" (PASSED|FAILED|ERROR|SKIPPED)", output))
        so_far = ", ".join(f"{count} {word.lower()}" for word, count in counts.items()) or "nothing"
        return {**result, "error": f"not measured: stopped at the stage's time limit after {seconds:.0f} s, "
                                   f"{so_far} by then"}
    lines = [line for line in output.splitlines() if line.strip()]
    return {**result, "rc": proc.returncode, "result": lines[-1].strip("= ") if lines else "no output"}


STAGES = {"tests": (test_rows, run_tests), "kernels": (kernel_rows, device_time), "host": (host_rows, host_time),
          "train": (train_rows, train_step)}


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
    import torch

    try:
        import triton

        version = f"triton {triton.__version__}"
    except ImportError:
        version = "no triton"
    name = torch.cuda.get_device_name() if plan.device == "cuda" else "CPU (rehearsal, TRITON_INTERPRET=1)"
    return f"{name}, torch {torch.__version__}, {version}, {plan.dtype}"


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
                gc.collect()
                if plan.device == "cuda" and not result.get("context_lost"):
                    import torch

                    torch.cuda.empty_cache()
        rows.append({**spec, **result})
        print(stage, json.dumps({k: v for k, v in rows[-1].items() if k not in ("traceback", "kernels")}),
              flush=True)
        write_atomic(file, json.dumps({**header, "autotuned": autotuned(), "rows": rows}, indent=1) + "\n")
        if current is not None:
            current.unlink(missing_ok=True)
        if result.get("context_lost"):
            return RESTART
    return 0


# --- the session --------------------------------------------------------------------------------------------------

def session(plan: Plan, out: Path, rehearse: bool) -> int:
    for stage in [*STAGES, "summary"]:
        (out / f"{stage}.{'md' if stage == 'summary' else 'json'}").unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_session-"))  # the train stage's corpus, cache and runs
    log = out / "session.log"
    # the budgets count from the call's start: gpu_session.sh's, before it installed the kit's wheels
    start = end = min(float(os.environ.get("GPU_SESSION_STARTED") or time.time()), time.time())
    try:
        with log.open("w") as sink:
            for stage, budget in BUDGETS.items():
                end += budget
                status, restarts = RESTART, 0
                if time.time() >= end - SLACK:
                    print(f"gpu_session: stage {stage}: not started, its time is gone", flush=True)
                while again(status, restarts) and time.time() < end - SLACK:
                    restarts += status != RESTART
                    started = time.time()
                    command = [sys.executable, __file__, "--stage", stage, "--deadline", f"{end - SLACK:.0f}",
                               "--out", str(out), "--work", str(work)] + ["--rehearse"] * rehearse
                    with subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                          start_new_session=True) as proc:
                        try:
                            status = proc.wait(timeout=end - time.time())
                        except subprocess.TimeoutExpired:
                            os.killpg(proc.pid, signal.SIGKILL)
                            status = f"stopped at its time limit ({proc.wait()})"
                    line = f"gpu_session: stage {stage}: exit {status} after {time.time() - started:.0f} s"
                    print(line, file=sink, flush=True)
                    if status not in (0, RESTART):  # what the stage said last (a traceback, say) comes back too
                        print("\n".join(f"  | {said}" for said in log.read_text().splitlines()[-12:]))
                    print(line, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for staged in out.glob(".*.tmp"):  # what a stage stopped in the middle of writing: not one of the files
        staged.unlink()
    text, short = summary(out, plan)
    write_atomic(out / "summary.md", text)
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
    """Each bar's verdict, one line each: pass, fail, or not measured."""

    def __init__(self):
        self.lines: list[str] = []
        self.counts = Counter()

    def add(self, name: str, where: str, value: float | None, limit: float, at_most: bool) -> None:
        if value is None:
            verdict = "not measured"
        else:
            verdict = "pass" if (value <= limit if at_most else value >= limit) else "fail"
        self.counts[verdict] += 1
        bound = f"{'<=' if at_most else '>='} {limit:g}x"
        self.lines.append(f"| {name} | {where} | {times(value)} | {bound} | {verdict} |")

    def text(self) -> list[str]:
        total = sum(self.counts.values())
        said = f"Bars passed: {self.counts['pass']} of {total}"
        if self.counts["fail"] or self.counts["not measured"]:
            said += f" ({self.counts['fail']} failed, {self.counts['not measured']} not measured)"
        return [*table("| bar | where | measured | bar | verdict |", self.lines), "", said + "."]


def kernel_bars(bars: Bars, rows: list[dict], plan: Plan) -> None:
    by_key = {key(row): row for row in rows}
    field = time_field(plan)
    for arm, limit, smallest in KERNEL_BARS:
        least = plan.long if smallest == "long" else smallest
        for batch, heads, n in plan.shapes:
            if n < least:
                continue
            row = by_key.get(key(dict(batch=batch, heads=heads, n=n, arm=arm)))
            base = by_key.get(key(dict(batch=batch, heads=heads, n=n, arm=ARMS[arm].baseline)))
            bars.add(BAR_NAMES[arm], f"{batch} x {heads} x {n:,}", ratio(row, base, field), limit, True)


def train_bars(bars: Bars, rows: list[dict], plan: Plan) -> None:
    by_key = {key(row): row for row in rows}
    for mode in TOKENS_BARS:
        for batch in plan.train.batches:
            row = by_key.get(key(dict(mode=mode, batch=batch, arm="composite")))
            base = by_key.get(key(dict(mode=mode, batch=batch, arm="absolute")))
            where = f"batch {batch}, {mode}"
            bars.add("training step: composite's tokens/s vs absolute's", where,
                     ratio(row, base, "tokens_per_s"), TOKENS_BARS[mode], False)
            bars.add("training step: composite's peak memory vs absolute's", where,
                     ratio(row, base, "peak_mib"), MEMORY_BAR, True)


def kernel_table(rows: list[dict], plan: Plan) -> list[str]:
    by_key = {key(row): row for row in rows}
    field = time_field(plan)
    lines = []
    for row in sorted(rows, key=lambda r: (list(plan.shapes).index((r["batch"], r["heads"], r["n"])),
                                           list(ARMS).index(r["arm"]))):
        arm = ARMS[row["arm"]]
        base = by_key.get(key({**row, "arm": arm.baseline})) if arm.baseline else None
        top = "; ".join(f"{k['name'][:70]} {k['ms']:.3f}" for k in row.get("kernels", [])[:2])
        measured = why(row) or cell(row, field, 3)
        lines.append(f"| {shape_name(row)} | {row['arm']} | {arm.baseline or '-'} | {measured} | "
                     f"{times(ratio(row, base, field))} | {cell(row, 'launches', 0)} | {top or '-'} |")
    return table(f"| batch x heads x n | arm | against | {'wall' if plan.rehearsal else 'device'} ms | ratio | "
                 "launches | top kernels (ms per call) |", lines)


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
        lines.append(f"| {shape_name(row)} | {row['arm']} | {why(row) or cell(row, 'host_ms', 3)} | "
                     f"{cell(row, 'launches', 0)} | "
                     f"{cell(row, 'host_us_per_launch', 1)} | {cell(row, 'wall_ms', 3)} | "
                     f"{cell(row, 'device_ms', 3)} | {bound} |")
    return table("| batch x heads x n | arm | host ms per call | launches | host us per launch | wall ms | "
                 "device ms | verdict |", lines)


def train_table(rows: list[dict]) -> list[str]:
    by_key = {key(row): row for row in rows}
    lines = []
    for row in rows:
        base = by_key.get(key({**row, "arm": "absolute"}))
        busy = "-" if row.get("busy") is None else f"{row['busy']:.0%}"
        note = row.get("recompiled") or row.get("stopped") or ""
        measured = why(row) or cell(row, "tokens_per_s", 0)
        lines.append(f"| {row['mode']} | {row['batch']} | {row['arm']} | {measured} | "
                     f"{times(ratio(row, base, 'tokens_per_s'))} | {cell(row, 'ms_per_step', 1)} | "
                     f"{cell(row, 'peak_mib', 0)} | {times(ratio(row, base, 'peak_mib'))} | {busy} | "
                     f"{cell(row, 'first_step_s', 1)} | {note} |")
    return table("| mode | batch | arm | tokens/s | vs absolute | ms per step | peak MiB | vs absolute | device busy | "
                 "s to step 1 | note |", lines)


def summary(out: Path, plan: Plan) -> tuple[str, str]:
    """summary.md's text, and its short part: the tests, the bars with their verdicts, the stages' tables, what
    failed."""
    stages = {stage: planned(out, stage, plan) for stage in STAGES}
    machine_name = next((name for _, name in stages.values() if name), "no stage ran")
    tests = []
    for row in stages["tests"][0]:
        selection = f" -k '{row['selection']}'" if row.get("selection") else ""
        said = f"{row['result']} (exit {row['rc']})" if "rc" in row else row["error"]
        if row.get("first_failure"):
            said += f"; first failure: {row['first_failure']}"
        tests.append(f"- `pytest -x {' '.join(row.get('files', []))}{selection}`: {said}")
    bars = Bars()
    kernel_bars(bars, stages["kernels"][0], plan)
    train_bars(bars, stages["train"][0], plan)
    problems = Counter(f"{stage}: {row['error']}" for stage, (rows, _) in stages.items()
                       for row in rows if "error" in row)
    stand_in = "; in the rehearsal the wall time under the profiler stands in" if plan.rehearsal else ""
    short = [
        f"# GPU session: {machine_name}", "",
        f"`bash benchmarks/gpu_session.sh`: attention forward + backward, {plan.head_dim} channels a head, padding "
        f"1/8 of one row, attention dropout {DROPOUT:g} where named; the training step through `convattn pretrain`.",
        "",
        "## Tests", "", *(tests or ["- not run"]), "",
        f"## Bars on {machine_name.split(', torch')[0]}", "",
        f"Attention: the device's time per forward + backward (the profiler's kernel sums{stand_in}) over its "
        "SDPA baseline's. Training step: composite's over absolute's, the same batch and mode.", "",
        *bars.text(), "",
        "## Device time per call (stage kernels)", "", *kernel_table(stages["kernels"][0], plan), "",
        "SDPA's kernels:", "", *sdpa_kernels(stages["kernels"][0]), "",
        "## Host time per call and per launch (stage host; launch-bound: the host issues the call slower than the "
        "device runs it)", "", *host_table(stages["host"][0]), "",
        "## Training step: `convattn pretrain`, chang2021-small recipe (stage train; tokens that are not padding, "
        "per second of the timed steps after the warm-up; device busy: kernel time over wall time; s to step 1: from "
        "the start of training, its first evaluation and the compilation included)", "",
        *train_table(stages["train"][0]), "",
        "## Failed, skipped or not measured", "",
        *([f"- {count} x {text[:200]}" for text, count in problems.most_common(12)] or ["- nothing"]),
        *[f"- and {len(problems) - 12} other reasons: the stages' files"] * (len(problems) > 12),
    ]
    text = "\n".join(short) + "\n"
    every = [f"- {shape_name(row)} {row['arm']}: " + (", ".join(f"`{k['name']}` {k['ms']:.4f} ms x {k['calls']:g}"
                                                               for k in row.get("kernels", [])) or "-")
             for row in stages["kernels"][0] if "error" not in row]
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
    args = parser.parse_args()
    plan = REHEARSAL if args.rehearse else GPU
    if args.rehearse and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--rehearse runs the kernel under Triton's interpreter: set TRITON_INTERPRET=1 (gpu_session.sh "
                     "does)")
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
        print(short)
        return 0
    if args.stage:
        plan = dataclasses.replace(plan, work=str(args.work or tempfile.mkdtemp(prefix="gpu_session-")))
        return run_stage(args.stage, plan, out, args.deadline)
    return session(plan, out, args.rehearse)


if __name__ == "__main__":
    sys.exit(main())
