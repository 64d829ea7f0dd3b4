"""The benchmarks' one harness: what every benchmark in this folder shares, defined once. A benchmark is its set-up
(the models and inputs of each arm) and its arms; the harness gives it

  a run      `Run`: the command, the commit, the machine and the date of one run, and the figures it measured,
             appended as one JSON line to benchmarks/results/<benchmark>.jsonl when the run ends (with what it had
             measured and why it stopped where it fails); `machine_line` describes the machine once for every report
  timing     `interleaved`: the arms take turns within every repetition, so that a slow phase of the machine hits
             them alike; `Spread`: the median and the range of a list of samples; `least_per_call` for host costs
  memory     `memory_of` (peak resident memory of a step, VmHWM, and its growth) and `fresh_processes`, which runs
             each arm in a process of its own, so that its peak is its own
  baselines  transformers' BERT of a convattn config's shape with SDPA (`bert_config`), trained by transformers'
             own Trainer with convattn's optimizer and precision rules (`bert_trainer`); `padded_keep` pads 1/8 of
             one row, as every arm of these benchmarks does
  steps      `StepMeter`: a Trainer callback that times a run's warm-up, timed and profiled steps (`step_meter`,
             `metered` to add it to every Trainer a command builds), and `device_time`: the device's kernel sums
             under torch.profiler
  kernels    `kernel_operands`: the fused kernel's operands as a layer lays them out, one feature at a time;
             `through_operators`: its eager calls through torch.library's operators, as compiled calls go

torch and transformers are imported where they are needed: gpu_session.py's own process reads this module without
them. Rows go to benchmarks/results/, or to $CONVATTN_BENCHMARK_RESULTS where set (the tests' scratch folder).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import itertools
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_MD = ROOT / "benchmarks" / "RESULTS.md"  # what the reports' figures are quoted in
DATA = ROOT.parent / "shared" / "data"  # the project's data sets, beside the checkout


# --- a run: its command, commit, machine, and the figures it appends ------------------------------------------------

def command_line(argv: list[str] | None = None, script: str | None = None, program: str = "python") -> str:
    """The command that made this run, as one would type it from the repository's root."""
    script = script or f"benchmarks/{Path(sys.argv[0]).name}"
    return shlex.join([program, script, *(sys.argv[1:] if argv is None else argv)])


def commit() -> str:
    """The checkout's short commit, "+changes" where its tracked files differ from it; "unknown" outside git."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if found.returncode != 0 or not found.stdout.strip():
        return "unknown"
    dirty = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "src", "benchmarks/*.py",
                            "benchmarks/*.sh"], capture_output=True).returncode
    return found.stdout.strip() + ("+changes" if dirty == 1 else "")


def version(package: str) -> str:
    """`package` and its version ("no package" where it does not import)."""
    try:
        return f"{package} {importlib.import_module(package).__version__}"
    except ImportError:
        return f"no {package}"


def machine_line(where: str = "cpu", packages: tuple[str, ...] = ("torch",), threads: int | bool = True,
            extra: tuple[str, ...] = ()) -> str:
    """The machine in one line: the CPU and its cores ("cpu"), the GPU's name ("cuda"), or `where` as given; the
    packages' versions; torch's threads (`threads` True: as set now; a number: that); then `extra`."""
    import torch

    from convattn.runs.environment import cpu_name  # a cost ratio depends on the CPU (convattn.denormals)

    place = {"cpu": lambda: f"{cpu_name()}, {os.cpu_count()} cores",
             "cuda": torch.cuda.get_device_name}.get(where, lambda: where)()
    parts = [place, *(version(package) for package in packages)]
    if threads:
        parts.append(f"{torch.get_num_threads() if threads is True else threads} threads")
    if where == "cpu":
        from convattn.denormals import denormals_flushed

        parts.append(f"denormals {'flushed' if denormals_flushed() else 'kept'}")
    return ", ".join([*parts, *extra])


def results_dir() -> Path:
    return Path(os.environ.get("CONVATTN_BENCHMARK_RESULTS") or RESULTS)


class Run:
    """One run of a benchmark. `add` keeps a figure (a dict: what was measured, under which arm and shape); the run
    ends by appending one JSON line to benchmarks/results/<benchmark>.jsonl: benchmark, command, commit, machine,
    date, the run's settings (`fields`) and its figures. As a context manager it appends the line however the block
    ends: a failure adds "unfinished" (its error) to the figures measured before it. budget_clock.jsonl's format."""

    def __init__(self, benchmark: str, machine: str | None = None, command: str | None = None,
                 path: Path | None = None, **fields):
        self.benchmark, self.fields, self.figures = benchmark, fields, []
        self.command = command or command_line()
        self.machine = machine  # None: machine_line() when the row is written
        self.path = path or results_dir() / f"{benchmark}.jsonl"

    def add(self, **figure) -> dict:
        self.figures.append(figure)
        return figure

    def row(self, **more) -> dict:
        return {"benchmark": self.benchmark, "command": self.command, "commit": commit(),
                "machine": self.machine or machine_line(), "date": time.strftime("%Y-%m-%d"),
                **self.fields, **more, "figures": self.figures}

    def save(self, **more) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(self.row(**more), default=str) + "\n")
        print(f"{self.benchmark}: appended a row to {self.path}", file=sys.stderr, flush=True)
        return self.path

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is None:
            self.save()
        elif not issubclass(kind, KeyboardInterrupt | SystemExit) or self.figures:
            said = "".join(traceback.format_exception_only(kind, error)).strip()[-300:]
            self.save(unfinished=said or kind.__name__)


def convattn(argv: list[str], env: dict | None = None, quiet: bool = True) -> None:
    """`convattn ARGV` in a process of its own, as a user runs it; its output kept back where `quiet` (shown only
    where it fails, whose error ends the benchmark)."""
    done = subprocess.run([sys.executable, "-m", "convattn", *argv], env={**os.environ, **(env or {})},
                          capture_output=quiet, text=True)
    if done.returncode != 0:
        raise SystemExit(f"convattn {shlex.join(argv)} failed (exit {done.returncode})"
                         + (f":\n{done.stderr[-2000:]}" if quiet else ""))


def busy_processes(count: int) -> list[subprocess.Popen]:
    """`count` processes that each hold a core (a Python loop), the load beside which clock-sensitive arms run; kill
    them when done."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def heading(title: str, *about: str) -> list[str]:
    """A markdown report's first lines: its title, the command that made it, then `about` (the machine, the set-up)."""
    return [f"# {title}", "", f"Command: `{command_line()}`  ", *about]


def report(path: Path, lines: list[str] | str, quiet: bool = False) -> int:
    """A benchmark's report (its lines, or its text), written whole (a reader never sees half of it), and said; 0,
    the benchmark's exit status. Over a report that RESULTS.md quotes, one line says so: its figures there now
    disagree with the file until RESULTS is brought up to date or the file restored (a check run once replaced the
    position study's costs unnoticed)."""
    from convattn.files import write_text_atomic

    quoted = path.exists() and quoted_in_results(path)
    write_text_atomic(path, lines if isinstance(lines, str) else "\n".join(lines) + "\n")
    if not quiet:
        print(f"wrote {path}")
    if quoted:
        print(f"note: RESULTS.md quotes {quoted}, which this run replaced: bring RESULTS up to date with it, or "
              f"restore it (git checkout -- benchmarks/{quoted}) and write check runs under another --output",
              file=sys.stderr)
    return 0


def quoted_in_results(path: Path) -> str | None:
    """`results/<name>` where RESULTS.md links the report at `path` (under benchmarks/results/), else None."""
    try:
        name = Path(path).resolve().relative_to(RESULTS.resolve()).as_posix()
    except ValueError:
        return None
    cited = f"results/{name}"
    return cited if RESULTS_MD.is_file() and f"({cited})" in RESULTS_MD.read_text(encoding="utf-8") else None


def emit(lines: list[str], *cells) -> None:
    """A markdown table's row of `cells`: kept for the report and printed as it comes."""
    row = "| " + " | ".join(str(cell) for cell in cells) + " |"
    lines.append(row)
    print(row, flush=True)


def arguments(doc: str, *, shapes: str | None = None, reps: int | None = None, threads: int | None = None,
              output: str | None = None, arm: bool = False) -> argparse.ArgumentParser:
    """A benchmark's parser: its docstring as its help, and the flags the benchmarks share, each where its default is
    given: --shapes (n x batch, comma-separated), --reps, --threads (torch's CPU threads), --output (a file name
    under benchmarks/results/), and with `arm` the hidden --arm of `fresh_processes`' children."""
    parser = Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if shapes is not None:
        parser.add_argument("--shapes", default=shapes, help="n x batch, comma-separated")
    if reps is not None:
        parser.add_argument("--reps", type=int, default=reps)
    if threads is not None:
        parser.add_argument("--threads", type=int, default=threads)
    if output is not None:
        parser.add_argument("--output", type=results_path, default=RESULTS / output,
                            help="a file name (written under benchmarks/results/) or a path")
    if arm:
        parser.add_argument("--arm", help=argparse.SUPPRESS)
    return parser


class Parser(argparse.ArgumentParser):
    """A benchmark's parser: its --keep-denormals, and once the arguments are read, denormal floats flushed as the
    command line flushes them (before the first parallel region starts OpenMP's threads: convattn.denormals), so
    that the benchmark times what a convattn command computes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument("--keep-denormals", action="store_true",
                          help="keep denormal floats, as a library caller who does not flush them (RESULTS 8.8)")

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = super().parse_known_args(args, namespace)
        if not parsed.keep_denormals:
            from convattn.denormals import flush_denormals

            flush_denormals()
        return parsed, rest


def results_path(text: str) -> Path:
    """--output: a bare file name goes under benchmarks/results/, beside the rows; a path is taken as given."""
    path = Path(text)
    return RESULTS / path if path.parent == Path(".") else path


def shapes(text: str) -> list[tuple[int, ...]]:
    """ "512x16,2048x4" -> [(512, 16), (2048, 4)] (the benchmarks' --shapes)."""
    return [tuple(int(x) for x in shape.split("x")) for shape in text.split(",")]


# --- timing ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spread:
    """The median of a list of samples and their range."""

    median: float
    least: float
    most: float
    count: int

    @classmethod
    def of(cls, samples: list[float]) -> Spread:
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    def ms(self, digits: int = 0) -> str:
        """Seconds as "median [min, max]" milliseconds."""
        return f"{self.median * 1e3:.{digits}f} [{self.least * 1e3:.{digits}f}, {self.most * 1e3:.{digits}f}]"

    def figure(self, scale: float = 1e3, digits: int = 4) -> dict:
        return {"median": round(self.median * scale, digits), "min": round(self.least * scale, digits),
                "max": round(self.most * scale, digits), "reps": self.count}


def interleaved(steps: dict[str, Callable[[], None]], reps: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds of each call of each function over `reps` repetitions after `warmup`, the functions taking turns within
    every repetition, so that a slow phase of the machine hits all of them alike and their ratios stay meaningful."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for rep in range(warmup + reps):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            if rep >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def spreads(steps: dict[str, Callable[[], None]], reps: int, warmup: int = 1) -> dict[str, Spread]:
    """`interleaved`'s median and range of each function's seconds per call."""
    return {name: Spread.of(values) for name, values in interleaved(steps, reps, warmup).items()}


def time_interleaved(steps: dict[str, Callable[[], None]], reps: int, warmup: int = 1) -> dict[str, float]:
    """`interleaved`'s median seconds per call of each function."""
    return {name: statistics.median(values) for name, values in interleaved(steps, reps, warmup).items()}


def least_per_call(fn: Callable[[], object], calls: int, rounds: int, warmup: int = 0) -> float:
    """Seconds per call: the least over `rounds` of the mean of `calls` calls (the machine's other work only adds)."""
    for _ in range(warmup):
        fn()
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        means.append((time.perf_counter() - start) / calls)
    return min(means)


# --- memory ---------------------------------------------------------------------------------------------------------

def status_bytes(field: str) -> int:
    """VmRSS / VmHWM (peak RSS) of this process from /proc; unlike ru_maxrss, VmHWM starts afresh at exec, so it is
    not the parent's peak."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def memory_of(step: Callable[[], None]) -> dict:
    """The first call of `step` in this process: its peak resident memory, the peak's growth over the memory resident
    before it (what the call added: activations, gradients, workspaces), and its seconds."""
    before = status_bytes("VmRSS")
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    peak = status_bytes("VmHWM")
    return {"peak": peak, "growth": peak - before, "seconds": seconds}


def measure_arm(arm: str, build: Callable[..., Callable[[], None]], *args) -> int:
    """The child's side of `fresh_processes`: the memory of the first step `build(arm, *args)` returns, printed as
    JSON; 0, the child's exit status."""
    print(json.dumps({"arm": arm, **memory_of(build(arm, *args))}))
    return 0


def fresh_processes(script: str, arms: list[str], argv: list[str], flag: str = "--arm") -> dict[str, dict]:
    """Each arm measured by `script flag ARM *argv` in a fresh process (so that its peak is its own), which prints
    its measurement as JSON on its last line."""
    measured = {}
    for arm in arms:
        done = subprocess.run([sys.executable, script, flag, arm, *argv], capture_output=True, text=True, check=True)
        measured[arm] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


# --- the baselines --------------------------------------------------------------------------------------------------

# the fields transformers' BertConfig shares with ConvAttnConfig (their defaults are BERT's)
BERT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "max_position_embeddings", "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
               "layer_norm_eps", "type_vocab_size", "initializer_range")


def bert_config(shape, **overrides):
    """transformers' BertConfig of `shape`'s shape (a ConvAttnConfig, or a dict of its fields: config.json's) with SDPA
    attention; BERT has no embedding projection, so its embeddings are the hidden size wide."""
    from transformers import BertConfig

    fields = shape if isinstance(shape, dict) else shape.to_dict()
    settings = {name: fields[name] for name in BERT_FIELDS if name in fields}
    return BertConfig(**{**settings, "attn_implementation": "sdpa", **overrides})


def padded_keep(batch: int, n: int, device: str = "cpu", dtype=None):
    """The benchmarks' key mask: every token real but the last 1/8 of the first row (so that masking paths run)."""
    import torch

    keep = torch.ones(batch, n, dtype=dtype or torch.bool, device=device)
    keep[0, n - n // 8:] = 0
    return keep


def bert_trainer(model, tokenizer, dataset, output_dir, *, steps: int, batch: int, precision: str = "fp32",
                 compile_mode: str | None = None, seed: int = 0, callbacks=(), mlm_probability: float = 0.15,
                 **optimizer):
    """transformers' Trainer for the masked-LM baseline, as convattn's pretraining runs its own: fused AdamW, a linear
    schedule, no evaluation or checkpoint, the precision and torch.compile fields by convattn's rules
    (training/execution.py), masks at `mlm_probability` padded to a multiple of 8. `optimizer`: learning_rate,
    weight_decay, warmup_steps, max_grad_norm, adam_* and any other TrainingArguments field."""
    import torch
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from convattn.training.execution import compile_arguments, precision_flags, stays_on_cpu

    flags = precision_flags(precision)
    arguments = TrainingArguments(
        output_dir=str(output_dir), max_steps=steps, per_device_train_batch_size=batch, optim="adamw_torch_fused",
        lr_scheduler_type="linear", seed=seed, data_seed=seed, eval_strategy="no", save_strategy="no",
        logging_steps=steps, report_to="none", disable_tqdm=True, remove_unused_columns=False,
        dataloader_num_workers=0, dataloader_pin_memory=torch.cuda.is_available(), **compile_arguments(compile_mode),
        **flags, use_cpu=stays_on_cpu(flags["bf16"]), **optimizer)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability, pad_to_multiple_of=8)
    return Trainer(model=model, args=arguments, data_collator=collator, train_dataset=dataset,
                   processing_class=tokenizer, callbacks=list(callbacks))


# --- the training step ----------------------------------------------------------------------------------------------

class NotMeasured(Exception):
    """A row that cannot run here: its reason is the row's."""


# the formatted examples' columns a baseline trained on convattn's examples reads
SAVED = ("input_ids", "token_type_ids", "special_tokens_mask")


class StepMeter:
    """The steps of one training run, measured from a Trainer's callbacks:

      warm-up   the first `warmup` steps (compilation, the allocator's first growth);
      timed     the next `timed` steps, synchronised at both ends: milliseconds per step, tokens per second (the
                Trainer's own count), the allocator's peak since training began; with `every_step`, each step's end
                too (synchronised), for the median step (`steady`);
      profiled  `profiled` steps more under torch.profiler: the device's kernel time per step (`device_time`) over
                the timed steps' wall time is the device's busy share.

    Stops the training after the profiled steps, or at `deadline` (Unix time). Where `capture` is a folder, it also
    saves there the first `examples` examples of the run's training data, its tokenizer and its model's shape, for a
    baseline trained on the same examples. A transformers.TrainerCallback through `step_meter`, which builds one."""

    def __init__(self, warmup: int, timed: int, profiled: int = 0, deadline: float = math.inf,
                 capture: Path | None = None, examples: int = 0, every_step: bool = False):
        import torch

        self.warmup, self.timed, self.profiled, self.deadline = warmup, timed, profiled, deadline
        self.capture, self.examples, self.every_step = capture, examples, every_step
        self.cuda = torch.cuda.is_available()
        self.marks: dict[str, tuple[float, int, int]] = {}
        self.result: dict = {}
        self.profiler = None
        self.started: float | None = None  # the first step's start
        self.ends: list[float] = []  # each step's end, with every_step

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def mark(self, name: str, state) -> None:
        self.sync()
        self.marks[name] = (time.perf_counter(), state.num_input_tokens_seen, graphs_compiled())

    def on_train_begin(self, args, state, control, train_dataloader=None, processing_class=None, model=None,
                       **kwargs):
        import torch

        if self.cuda:
            self.sync()
            torch.cuda.reset_peak_memory_stats()
            self.result["allocated_mib"] = round(torch.cuda.memory_allocated() / 2**20, 1)
        self.mark("begin", state)
        if self.capture is not None and not (self.capture / "model.json").exists():
            save_examples(self.capture, train_dataloader, processing_class, model, self.examples)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.started is None:
            self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        import torch

        if self.every_step:
            self.sync()
            self.ends.append(time.perf_counter())
        step = state.global_step
        if step == 1:
            self.mark("first", state)
        if step == self.warmup:
            self.mark("warm", state)
        elif step == self.warmup + self.timed:
            self.mark("timed", state)
            if self.cuda:
                self.result["peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            if not self.profiled:
                control.should_training_stop = True
                return control
            activities = [torch.profiler.ProfilerActivity.CUDA if self.cuda else torch.profiler.ProfilerActivity.CPU]
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
        elif step == self.warmup + self.timed + self.profiled:
            self.sync()
            self.profiler.__exit__(None, None, None)
            self.result.update(device_time(self.profiler, self.profiled))
            self.profiler = None
            control.should_training_stop = True
        if time.time() > self.deadline and not control.should_training_stop:
            self.result["stopped"] = f"at step {step}: the stage's time ran out"
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            self.profiler = None

    def measured(self) -> dict:
        """What the run measured; raises where it stopped before the timed steps ended."""
        if "timed" not in self.marks:
            if "stopped" in self.result:
                raise NotMeasured(f"stopped {self.result['stopped']}")
            raise RuntimeError("the run ended before its timed steps")
        (start, tokens, graphs), (end, tokens_end, graphs_end) = self.marks["warm"], self.marks["timed"]
        seconds = end - start
        result = {"tokens_per_s": round((tokens_end - tokens) / seconds, 1),
                  "ms_per_step": round(seconds / self.timed * 1e3, 3), "steps": self.timed,
                  "first_step_s": round(self.marks["first"][0] - self.marks["begin"][0], 2),
                  "warmup_s": round(start - self.marks["begin"][0], 2), **self.result}
        if graphs_end != graphs:
            result["recompiled"] = f"{graphs_end - graphs} graph(s) compiled during the timed steps"
        if result.get("device_ms") is not None:
            result["busy"] = round(min(result["device_ms"] / result["ms_per_step"], 1.0), 3)
        return result

    def steady(self, tokens_per_step: int) -> dict:
        """With every_step: tokens/s at the median time of the steps after the warm-up (a step slowed by another
        process on the machine does not count), and the seconds from the first step's start to the warm-up's end."""
        steady = self.ends[self.warmup - 1:]
        if len(steady) < 2:
            raise ValueError(f"only {len(self.ends)} steps timed; the steps must exceed the warm-up's")
        step_seconds = statistics.median(b - a for a, b in itertools.pairwise(steady))
        return {"tokens_per_second": tokens_per_step / step_seconds, "warmup_seconds": steady[0] - self.started}


@functools.cache
def _callback_class() -> type:
    from transformers import TrainerCallback

    return type("StepMeter", (StepMeter, TrainerCallback), {})


def step_meter(*args, **kwargs) -> StepMeter:
    """A StepMeter that is a transformers.TrainerCallback (the Trainer's other events: nothing)."""
    return _callback_class()(*args, **kwargs)


@contextlib.contextmanager
def metered(meter: StepMeter):
    """Every transformers.Trainer built inside takes `meter` among its callbacks (convattn's Trainer subclasses it:
    the command line's own run, unchanged)."""
    import transformers

    original = transformers.Trainer.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.add_callback(meter)

    transformers.Trainer.__init__ = init
    try:
        yield meter
    finally:
        transformers.Trainer.__init__ = original


def graphs_compiled() -> int:
    """The graphs torch.compile made in this process so far (0 where torch does not say)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # a private counter: it may move
        return 0


def save_examples(folder: Path, loader, tokenizer, model, count: int) -> None:
    """The first `count` examples of the run's data, its tokenizer and its model's shape (config.json's fields)."""
    import torch

    if loader is None or tokenizer is None or model is None:
        raise RuntimeError("the Trainer's callbacks did not receive the data loader, tokenizer and model")
    dataset = loader.dataset
    columns = dataset[:min(count, len(dataset))]  # a datasets.Dataset's slice: {column: [values]}
    kept = [name for name in SAVED if name in columns]
    picked = [dict(zip(kept, values, strict=True)) for values in zip(*(columns[name] for name in kept), strict=True)]
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(picked, folder / "examples.pt")
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    config = getattr(model, "config", None) or model.module.config
    (folder / "model.json").write_text(json.dumps(config.to_dict(), default=str))


# --- the device's time ----------------------------------------------------------------------------------------------

def device_events(prof) -> list:
    """The device's events (kernels, copies, memsets) a torch.profiler run recorded."""
    from torch.autograd import DeviceType

    return [e for e in prof.events() if e.device_type == DeviceType.CUDA]


def device_time(prof, steps: int, digits: tuple[int, int] = (3, 1)) -> dict:
    """Per step: the device's time (its kernels, copies and memsets, summed), ms, and how many it ran; None without
    device events (on CPU). `digits`: the rounding of each."""
    events = device_events(prof)
    if not events:
        return {"device_ms": None, "launches": None}
    return {"device_ms": round(sum(e.time_range.elapsed_us() for e in events) / steps / 1e3, digits[0]),
            "launches": round(len(events) / steps, digits[1])}


# --- the fused kernel's operands ------------------------------------------------------------------------------------

HEAD_DIM, REACH, DROPOUT = 64, 8, 0.1


def kernel_operands(features, batch: int, heads: int, n: int, head_dim: int = HEAD_DIM, *, reach: int = REACH,
                    device: str = "cpu", dtype=None, generator=None, requires_grad: bool = False):
    """(q, k, v, row_table, key_table, keep, dropout_p) of the fused kernel, laid out as a layer makes them (q, k, v
    views of a (batch, n, heads * d) projection), with `features` (any of "row", "key": the tables; "padding": 1/8
    of one row masked; "keep": a mask with every key real; "dropout": DROPOUT); None where a feature is absent."""
    import torch

    dtype = dtype or torch.bfloat16
    q, k, v = (torch.randn(batch, n, heads, head_dim, device=device, dtype=dtype, generator=generator)
               .transpose(1, 2).requires_grad_(requires_grad) for _ in range(3))
    row, key = (torch.randn(batch, heads, n, 2 * reach + 1, device=device, dtype=dtype, generator=generator,
                            requires_grad=requires_grad) if name in features else None for name in ("row", "key"))
    keep = None
    if "padding" in features:
        keep = padded_keep(batch, n, device)
    elif "keep" in features:
        keep = torch.ones(batch, n, dtype=torch.bool, device=device)
    return q, k, v, row, key, keep, DROPOUT if "dropout" in features else 0.0


@contextlib.contextmanager
def through_operators():
    """Inside, the fused kernel's eager calls go through torch.library's operators, as torch.compile's do (the eager
    path before 2026-12-01, operator._EagerAttention): what skipping them saves, timed from one process."""
    from convattn.attention.relative.triton import operator

    eager = operator._eager
    operator._eager = lambda q: False
    try:
        yield
    finally:
        operator._eager = eager
