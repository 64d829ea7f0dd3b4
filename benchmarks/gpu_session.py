"""One GPU session in one command (issue 37): the fused relative-attention kernel and the decomposition against
plain SDPA, in stages of priority order, each time-boxed and writing its result file as soon as it exists:

  tests     one pytest: every test of the kernel (tests/attention/relative/test_triton_attention.py), then
            the CUDA tests of the decomposition and its inductor step (test_decomposition.py, test_compile.py)
  layer     one CompositeSelfAttention, forward + backward, training mode: the kernel ("triton"), the decomposition
            ("decomposed") and the dense bias ("dense"), each forced with dispatch.forced_path, against plain SDPA
            (preset "none", the baseline of the same dropout); composite and composite+key, small and base width,
            four lengths, attention dropout 0 and 0.1; the bars' rows (the kernel and SDPA, n >= 512) first
  encoder   the chang2021-small/composite encoder (the preset's dropout) through the kernel and through the
            decomposition, against transformers' BertModel-SDPA of its shape
  profile   where a layer step's time goes (small width, dropout 0.1, the layer stage's 2nd and 1st lengths): the
            host's time to issue the step, the device's kernel time (torch.profiler) and the kernel launches;
            launch-bound when issuing the step takes the host longer than the device takes to run it
  summary   the bars and tables from the stages' files: summary.md, printed last

Steps and measurement are attention_gpu.py's: CUDA events, the median of the timed steps after warm-up (Triton's
compilation in the warm-up); the allocator's peak during one step above what was allocated before it. An arm that
fails (an exception, out of memory) is recorded with its reason and the stage goes on; one that breaks the CUDA
context ends its stage's process, and the session starts the stage again without that path. A stage that runs out
of time records what it did not measure. A stage continues the rows its file already holds (the session removes
the files first).

    bash benchmarks/gpu_session.sh               # the GPU machine's one call: every stage in under 9 minutes
    bash benchmarks/gpu_session.sh --rehearse    # on CPU: tiny shapes, the kernel under TRITON_INTERPRET=1
    bash benchmarks/gpu_session.sh --stage layer --deadline $(( $(date +%s) + 240 ))    # one stage by hand

Files go to --out: $OUT where set (the GPU machine's folder that comes back), else benchmarks/results/gpu_session
(or a temporary folder when rehearsing).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from attention_gpu import WIDTHS, encoder_step, layer_step, measure
from common import write_atomic
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from convattn.attention.relative import dispatch

ROOT = Path(__file__).resolve().parents[1]
# the kernel's first: its tests may not exist yet
TEST_FILES = ("tests/attention/relative/test_triton_attention.py", "tests/attention/relative/test_decomposition.py",
              "tests/test_compile.py")
PRESETS = ("composite", "composite+key")
DROPOUTS = (0.0, 0.1)
# Seconds per stage, in order; a stage may use what the ones before it left. 495 s in all, under the 9 minutes
# the one call has on an H100 (the machine's start is not the command's).
BUDGETS = {"tests": 150, "layer": 240, "encoder": 60, "profile": 45}
SLACK = 10  # a stage's own deadline comes this much before its process is stopped
RESTART = 75  # a stage's exit status after an arm broke the CUDA context
SPEC = ("tests", "width", "n", "batch", "dropout", "preset", "arm")  # the fields that name a row
TIME_BAR, MEMORY_BAR, ENCODER_BAR = 1.25, 1.1, 1.15


@dataclass(frozen=True)
class Plan:
    device: str
    dtype: torch.dtype
    widths: dict[str, dict]  # config overrides per width
    lengths: tuple[int, ...]  # the layer's; the bars are at all but the first
    tokens: int  # per step: batch = tokens // n
    encoder_lengths: tuple[int, ...]
    reps: int
    warmup: int
    seconds: float  # at most this long on one arm's timed steps (at least one)
    profiled: int  # steps of each kind in the profile stage
    encoder: dict = field(default_factory=dict)  # the encoder's config overrides
    tests: str = "triton_attention or cuda"  # pytest -k: every test of the kernel, the others' CUDA tests

    def batch(self, n: int) -> int:
        return max(1, self.tokens // n)


GPU = Plan("cuda", torch.bfloat16, {"small": {}, "base": WIDTHS["base"]}, (128, 512, 2048, 8192), 16384, (128, 512),
           reps=20, warmup=3, seconds=1.0, profiled=5)
# A step of the kernel under the interpreter takes 0.3-2 s on CPU: one width, one step of each kind, no warm-up
TINY = dict(hidden_size=64, num_attention_heads=2, intermediate_size=128)
REHEARSAL = Plan("cpu", torch.float32, {"small": TINY}, (16, 40), 40, (16,), reps=1, warmup=0, seconds=0.0,
                 profiled=1, encoder=dict(TINY, num_hidden_layers=2, vocab_size=1000), tests="cuda")


# --- the rows of each stage, in the order they run ---------------------------------------------------------------

def test_rows(plan: Plan) -> list[dict]:
    return [{"tests": "cuda"}]


def layer_rows(plan: Plan) -> list[dict]:
    def row(width, n, dropout, preset, arm):
        return dict(width=width, n=n, batch=plan.batch(n), dropout=dropout, preset=preset, arm=arm)
    shapes = [(n, width, p) for n in plan.lengths for width in plan.widths for p in DROPOUTS]
    bars = [s for s in shapes if s[0] != plan.lengths[0]]
    rows = []
    for n, width, p in bars + [s for s in shapes if s not in bars]:
        # the kernel without terms beside SDPA: what the kernel itself costs, apart from the terms
        rows += [row(width, n, p, "none", "sdpa"), row(width, n, p, "none", "triton")]
        rows += [row(width, n, p, preset, "triton") for preset in PRESETS]
    for arm in ("decomposed", "dense"):
        rows += [row(width, n, p, preset, arm) for n, width, p in shapes for preset in PRESETS]
    return rows


def encoder_rows(plan: Plan) -> list[dict]:
    return [dict(n=n, batch=plan.batch(n), arm=arm) for n in plan.encoder_lengths
            for arm in ("bert-sdpa", "triton", "decomposed")]


def profile_rows(plan: Plan) -> list[dict]:
    width = next(iter(plan.widths))
    return [dict(width=width, n=n, batch=plan.batch(n), dropout=0.1, preset=preset, arm=arm)
            for n in (plan.lengths[1], plan.lengths[0]) for preset, arm in
            [("none", "sdpa"), ("none", "triton")]
            + [(preset, arm) for arm in ("triton", "decomposed", "dense") for preset in PRESETS]]


# --- measuring one row --------------------------------------------------------------------------------------------

def forced(arm: str) -> str | None:
    """The relative path an arm forces (None: the layer has no relative terms, or is transformers' BertModel)."""
    return arm if arm in ("triton", "decomposed", "dense") else None


def kernel_only(step):
    """`step`, whose first call raises where dispatch.py serves the forced "triton" path with one of the other paths
    (as it did before the kernel was wired in), so that a kernel arm never times something else."""
    others = ("attend", "decomposed_relative_attention", "blockwise_relative_attention", "flex_relative_attention")
    checked = False

    def refuse(name):
        def call(*args, **kwargs):
            raise RuntimeError(f"the forced triton path ran paths.{name} instead: no kernel behind it")
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


def run_tests(row: dict, plan: Plan, deadline: float) -> dict:
    """pytest on the test files (those that exist) with the plan's selection, stopped at the deadline."""
    files = [name for name in TEST_FILES if (ROOT / name).exists()]
    # several processes compile Triton's kernels side by side where pytest-xdist is installed (the GPU image)
    workers = ["-n", "8"] if plan.device == "cuda" and importlib.util.find_spec("xdist") else []
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfE", *workers, *files, "-k",
               plan.tests]
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
    missing = [name for name in TEST_FILES if name not in files]
    result = {"files": files, "missing": missing, "seconds": seconds}
    if proc.returncode == -signal.SIGKILL:
        counts = Counter(re.findall(r" (PASSED|FAILED|ERROR|SKIPPED)", output))
        so_far = ", ".join(f"{count} {word.lower()}" for word, count in counts.items()) or "nothing"
        return {**result, "error": f"not measured: stopped at the stage's time limit after {seconds:.0f} s, "
                                   f"{so_far} by then"}
    lines = [line for line in output.splitlines() if line.strip()]
    return {**result, "rc": proc.returncode, "result": lines[-1].strip("= ") if lines else "no output"}


def build(row: dict, plan: Plan):
    if "preset" in row:
        # without terms only attn_implementation="convattn_triton" reaches the kernel
        implementation = "convattn_triton" if row["preset"] == "none" and row["arm"] == "triton" else "sdpa"
        step, tensors = layer_step(row["preset"], plan.widths[row["width"]], row["n"], row["batch"], row["dropout"],
                                   implementation, path=forced(row["arm"]), device=plan.device, dtype=plan.dtype)
    else:
        step, tensors = encoder_step("bert-sdpa" if row["arm"] == "bert-sdpa" else "composite", plan.encoder,
                                     row["n"], row["batch"], None, path=forced(row["arm"]), device=plan.device,
                                     dtype=plan.dtype)
    return (kernel_only(step) if row["arm"] == "triton" else step), tensors


def timed(row: dict, plan: Plan, deadline: float) -> dict:
    result = measure(*build(row, plan), plan.reps, plan.warmup, min(plan.seconds, deadline - time.time()))
    peak = result.pop("peak")
    return {**{name: round(value, 4) for name, value in result.items()},
            "peak_mib": None if peak is None else round(peak / 2**20, 1)}


def where_time_goes(row: dict, plan: Plan, deadline: float) -> dict:
    step, tensors = build(row, plan)
    steps = plan.profiled
    cuda = plan.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def clear():
        for t in tensors:
            t.grad = None
    host, wall = [], []
    for i in range(plan.warmup + steps):
        sync()
        start = time.perf_counter()
        step()
        issued = time.perf_counter()
        sync()
        if i >= plan.warmup:
            host.append((issued - start) * 1e3)
            wall.append((time.perf_counter() - start) * 1e3)
        clear()
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
        for _ in range(steps):
            step()
            clear()
        sync()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    result = {"wall_ms": round(statistics.median(wall), 4), "host_ms": round(statistics.median(host), 4),
              "device_ms": None, "launches": None}
    if cuda:
        result["device_ms"] = round(sum(e.time_range.elapsed_us() for e in kernels) / steps / 1e3, 4)
        result["launches"] = len(kernels) / steps
    return result


STAGES = {"tests": (test_rows, run_tests), "layer": (layer_rows, timed), "encoder": (encoder_rows, timed),
          "profile": (profile_rows, where_time_goes)}


# --- a stage ------------------------------------------------------------------------------------------------------

def key(row: dict) -> tuple:
    return tuple(row.get(name) for name in SPEC)


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text}"[:240]


def context_lost(plan: Plan) -> bool:
    if plan.device != "cuda":
        return False
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").sum().item()
        return False
    except Exception:  # whatever this torch calls the sticky CUDA error
        return True


def machine(plan: Plan) -> str:
    try:
        import triton

        version = f"triton {triton.__version__}"
    except ImportError:
        version = "no triton"
    name = torch.cuda.get_device_name() if plan.device == "cuda" else "CPU (rehearsal, TRITON_INTERPRET=1)"
    return f"{name}, torch {torch.__version__}, {version}, {str(plan.dtype).removeprefix('torch.')}"


def autotuned() -> list[str]:
    """The tilings the kernel's autotuners chose in this process (on a GPU; none before the kernel ran)."""
    from convattn.attention.relative import triton_attention

    return triton_attention.autotuned_configs()


def run_stage(stage: str, plan: Plan, out: Path, deadline: float) -> int:
    rows_of, measure_row = STAGES[stage]
    file = out / f"{stage}.json"
    rows = load(out, stage)[0]
    done = {key(row) for row in rows}
    broken = {row["arm"] for other in STAGES for row in load(out, other)[0] if row.get("context_lost")}
    header = {"stage": stage, "machine": machine(plan)}
    for spec in rows_of(plan):
        if key(spec) in done:
            continue
        result = {}
        if spec.get("arm") in broken:
            result = {"error": f"skipped: the {spec['arm']} arm broke the CUDA context earlier"}
        elif time.time() >= deadline:
            result = {"error": "not measured: the stage ran out of time"}
        else:
            try:
                result = measure_row(spec, plan, deadline)
            except Exception as error:  # a failing arm is a result; the others go on
                result = {"error": f"failed: {one_line(error)}", "traceback": traceback.format_exc()[-1500:]}
                if context_lost(plan):
                    result["context_lost"] = True
            finally:
                gc.collect()
                if plan.device == "cuda" and not result.get("context_lost"):
                    torch.cuda.empty_cache()
        rows.append({**spec, **result})
        print(stage, json.dumps({k: v for k, v in rows[-1].items() if k != "traceback"}), flush=True)
        write_atomic(file, json.dumps({**header, "autotuned": autotuned(), "rows": rows}, indent=1) + "\n")
        if result.get("context_lost"):
            return RESTART
    return 0


# --- the session --------------------------------------------------------------------------------------------------

def session(plan: Plan, out: Path, rehearse: bool) -> int:
    for stage in [*STAGES, "summary"]:
        (out / f"{stage}.{'md' if stage == 'summary' else 'json'}").unlink(missing_ok=True)
    log = out / "session.log"
    start = end = time.time()
    with log.open("w") as sink:
        for stage, budget in BUDGETS.items():
            end += budget
            status = RESTART
            if time.time() >= end - SLACK:
                print(f"gpu_session: stage {stage}: not started, its time is gone", flush=True)
            while status == RESTART and time.time() < end - SLACK:
                started = time.time()
                command = [sys.executable, __file__, "--stage", stage, "--deadline", f"{end - SLACK:.0f}",
                           "--out", str(out)] + ["--rehearse"] * rehearse
                with subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True) as proc:
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
    text, short = summary(out, plan)
    write_atomic(out / "summary.md", text)
    print(f"gpu_session: {time.time() - start:.0f} s in all; files in {out}: "
          f"{', '.join(sorted(p.name for p in out.iterdir()))}\n")
    print(short, flush=True)
    return 0


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
    if row is None:
        return "-"
    if "error" in row:
        return row["error"].split(":")[0]
    return "-" if row.get(name) is None else f"{row[name]:.{digits}f}"


def cells(row: dict, names: tuple[str, ...], digits: tuple[int, ...]) -> str:
    """Table cells of a row's measurements; where it has none, why, once."""
    if "error" in row:
        return " | ".join([cell(row, names[0]), *["-"] * (len(names) - 1)])
    return " | ".join(cell(row, name, digit) for name, digit in zip(names, digits, strict=True))


def ratio(row: dict | None, base: dict | None, name: str) -> float | None:
    if not row or not base or row.get(name) is None or not base.get(name):
        return None
    return row[name] / base[name]


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def verdict(time_x: float | None, time_bar: float, memory_x: float | None = None, memory_bar: float = 0.0) -> str:
    if time_x is None:
        return "-"
    return "met" if time_x <= time_bar and (memory_x is None or memory_x <= memory_bar) else "missed"


def table(header: str, lines: list[str]) -> list[str]:
    return [header, "|---" * header.count(" | ") + "|---|", *lines]


def layer_tables(rows: list[dict]) -> tuple[list[str], list[str]]:
    """The bars (every kernel row past the shortest length, beside the decomposition and the dense bias) and
    every row."""
    by_key = {key(row): row for row in rows}

    def find(row, **changes):
        return by_key.get(key({**row, **changes}))
    bars = []
    for row in [row for row in rows if row["arm"] == "triton" and row["n"] != min(r["n"] for r in rows)]:
        base = find(row, preset="none", arm="sdpa")
        time_x, memory_x = ratio(row, base, "ms"), ratio(row, base, "peak_mib")
        bars.append(f"| {row['width']} | {row['n']} | {row['batch']} | {row['dropout']:g} | {row['preset']} | "
                    f"{cell(base, 'ms')} | {cell(row, 'ms')} | {times(time_x)} | {times(memory_x)} | "
                    f"{verdict(time_x, TIME_BAR, memory_x, MEMORY_BAR)} | "
                    f"{times(ratio(find(row, arm='decomposed'), base, 'ms'))} | "
                    f"{times(ratio(find(row, arm='dense'), base, 'ms'))} |")
    met = sum(line.count("| met |") for line in bars)
    bars = [*table("| width | n | batch | dropout | preset | SDPA ms | kernel ms | kernel time | kernel memory | "
                   "bar | decomposition time | dense time |", bars), "", f"Layer bars met: {met} of {len(bars)}."]
    every = []
    for row in rows:
        base = find(row, preset="none", arm="sdpa")
        measured = (f"{row['ms']:.2f} [{row['min']:.2f}, {row['max']:.2f}] | {row['reps']}" if "error" not in row
                    else f"{row['error'][:120]} | -")
        every.append(f"| {row['width']} | {row['n']} | {row['batch']} | {row['dropout']:g} | {row['preset']} | "
                     f"{row['arm']} | {measured} | {times(ratio(row, base, 'ms'))} | {cell(row, 'peak_mib', 0)} | "
                     f"{times(ratio(row, base, 'peak_mib'))} |")
    every = table("| width | n | batch | dropout | preset | arm | ms median [min, max] | reps | time | "
                  "step peak MiB | memory |", every)
    return bars, every


def encoder_table(rows: list[dict]) -> list[str]:
    lines = []
    for row in rows:
        base = next((r for r in rows if r["n"] == row["n"] and r["arm"] == "bert-sdpa"), None)
        time_x = ratio(row, base, "ms")
        lines.append(f"| {row['n']} | {row['batch']} | {row['arm']} | {cells(row, ('ms', 'peak_mib'), (2, 0))} | "
                     f"{times(time_x)} | {times(ratio(row, base, 'peak_mib'))} | "
                     f"{'' if row['arm'] == 'bert-sdpa' else verdict(time_x, ENCODER_BAR)} |")
    return table("| n | batch | arm | ms | peak MiB | time | memory | bar |", lines)


def profile_table(rows: list[dict]) -> list[str]:
    lines = []
    for row in rows:
        busy = ratio(row, {"device_ms": row.get("wall_ms")}, "device_ms")
        bound = "-" if busy is None else "launch-bound" if row["host_ms"] > row["device_ms"] else "device-bound"
        measured = cells(row, ("wall_ms", "host_ms", "device_ms", "launches"), (2, 2, 2, 0))
        lines.append(f"| {row['n']} | {row['preset']} | {row['arm']} | {measured} | "
                     f"{'-' if busy is None else f'{busy:.0%}'} | {bound} |")
    return table("| n | preset | arm | wall ms | host ms | device ms | launches | device busy | verdict |", lines)


def summary(out: Path, plan: Plan) -> tuple[str, str]:
    """summary.md's text, and its short part: the tests, the bars, the encoder, where the time goes, what failed."""
    stages = {stage: planned(out, stage, plan) for stage in STAGES}
    machine_name = next((name for _, name in stages.values() if name), "no stage ran")
    tests = [f"- `pytest {' '.join(row.get('files', TEST_FILES))} -k '{plan.tests}'`: "
             + (f"{row['result']} (exit {row['rc']})" if "rc" in row else row["error"])
             + "".join(f"; {name} does not exist yet" for name in row.get("missing", ()))
             for row in stages["tests"][0]]
    bars, every = layer_tables(stages["layer"][0])
    problems = Counter(f"{stage}: {row['error']}" for stage, (rows, _) in stages.items()
                       for row in rows if "error" in row)
    short = [
        f"# GPU session: {machine_name}", "",
        "`bash benchmarks/gpu_session.sh`: forward + backward in training mode, 1/8 of one row padded; ratios "
        "against plain SDPA (layers) or BertModel-SDPA (encoders) of the same shape and dropout.", "",
        "## Tests", "", *(tests or ["- not run"]), "",
        f"## Layer bars: the kernel within {TIME_BAR}x SDPA's time and {MEMORY_BAR}x its peak", "", *bars, "",
        f"## Encoder: chang2021-small/composite within {ENCODER_BAR}x BertModel-SDPA's time", "",
        *encoder_table(stages["encoder"][0]), "",
        f"## Where a layer step's time goes ({next(iter(plan.widths))} width, dropout 0.1; launch-bound: the host "
        "issues the step slower than the device runs it)", "",
        *profile_table(stages["profile"][0]), "",
        "## Failed, skipped or not measured", "",
        *([f"- {count} x {text[:200]}" for text, count in problems.most_common(12)] or ["- nothing"]),
        *[f"- and {len(problems) - 12} other reasons: the stages' files"] * (len(problems) > 12),
    ]
    text = "\n".join(short) + "\n"
    tuned = [f"- {line}" for line in tilings(out)] or ["- none (no kernel ran on a GPU)"]
    return text + "\n".join(["", "## Every layer row", "", *every, "", "## The kernel's autotuned tilings", "",
                             *tuned]) + "\n", text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rehearse", action="store_true", help="on CPU with tiny shapes (set TRITON_INTERPRET=1)")
    parser.add_argument("--stage", choices=[*STAGES, "summary"], help="run this stage alone (default: the session)")
    parser.add_argument("--deadline", type=float, help="with --stage: the Unix time by which it stops measuring")
    parser.add_argument("--out", type=Path, help="the results' folder (default: $OUT, else benchmarks/results/"
                                                 "gpu_session, or a temporary folder when rehearsing)")
    args = parser.parse_args()
    plan = REHEARSAL if args.rehearse else GPU
    if args.rehearse and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--rehearse runs the kernel under Triton's interpreter: set TRITON_INTERPRET=1 (gpu_session.sh "
                     "does)")
    if not args.rehearse and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --rehearse)")
    if args.rehearse:
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
        return run_stage(args.stage, plan, out, args.deadline)
    return session(plan, out, args.rehearse)


if __name__ == "__main__":
    sys.exit(main())
