"""The first real-scale run (issue 37): chang2021-small/composite against chang2021-small/absolute at the papers'
width and depth (L 12, H 256, 4 heads, n 128, batch 128, the chang2021-small recipe), the same wall-clock training
budget each on one GPU in ONE device call, the two pretrained models brought back, then GLUE dev (CoLA, SST-2,
MRPC, 3 seeds) of both on the CPU here.

Three stages, because the GPU machine has no network and no ../shared, and a device call returns at most 8 files
of at most 16 MiB each (64 MiB in all):

  pack  here, beside ../shared/data: writes the kit, .gpu-kit/ (about 40 MB, carried to the GPU machine): the
        training text (62 MB of Wikipedia and 50 MB of books, xz-compressed), WikiText-103 valid for evaluation,
        the GLUE tasks, a 30,004-piece unigram tokenizer trained here on the training text (the recipe's size),
        and the wheels of the Python packages the GPU machine lacks (benchmarks/gpu.sh installs them there).
  run   on the GPU machine, through benchmarks/gpu.sh: unpacks the kit into .gpu-work/ and tokenizes while
        background processes compile the fused kernel for the training's and evaluation's batches (the `warm`
        stage: compiled in a first step, that would count on the composite model's training clock and not on
        the absolute model's), pretrains both models with one `convattn compare` (no GLUE) until --stop-after
        seconds have passed (then interrupts it as Ctrl-C
        does; the same command continues it, the training clock included), and writes to --out the report, a
        status, the log and each finished model as <row>.tar.xz.partNN (the run folder without checkpoints, its
        weights in bfloat16, in parts of at most 15 MiB): 7 files. Its last line says "finished" or "run again".
  glue  here: joins the parts from --models (the device call's files; one folder a call), unpacks each model into
        .gpu-work/models/ with its weights back in float32, and runs `convattn glue` on each (resumable: run it
        again after a kill), then writes glue.md: every model in --out's glue.json (those of earlier calls kept)
        beside Chang et al.'s row of the same preset (their GLUE dev scores, Table 6, and test GLUE, Table 1),
        with its eval perplexity, steps, tokens and training time.

    python benchmarks/real_scale.py pack                                     # here (a few minutes)
    bash benchmarks/gpu.sh python3 benchmarks/real_scale.py run --out $OUT   # there: one call, carry [".gpu-kit"]
    python benchmarks/real_scale.py glue --models /work/.device/N --out benchmarks/results/real_scale

STS-B and RTE, which the issue names too, are not in ../shared/data, and the GPU machine cannot reach the hub.
SST-2 fine-tunes on a fixed random 20,000 of its 67,349 examples by default (--max-train-samples); CoLA and MRPC
are whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import harness

from convattn.files import atomic_path, write_json_atomic
from convattn.runs.finetune import GLUE_RESULTS
from convattn.training.pretrain.warm_up import warm_shapes
from convattn.training.seed_statistics import format_mean_sem

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
KIT, WORK = ROOT / ".gpu-kit", ROOT / ".gpu-work"
TEXT_SOURCES = ("enwiki-2015-sample", "gutenberg-books")
EVAL_FILE = "wiki.valid.raw"
GLUE_TASKS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC"}
PRESETS = "chang2021-small/absolute,chang2021-small/composite"
VOCAB_SIZE = 30004  # the chang2021-small recipe's
# What the GPU machine's image (Python 3.12, torch 2.11, transformers 5.17, huggingface_hub 1.33, tokenizers
# 0.23.2, pyarrow, pandas, fsspec, xxhash, ...) lacks: `datasets` and its own dependencies, and a tokenizers
# without 0.23.2's bug (truncation with overflowing tokens drops windows, huggingface/tokenizers#2091).
# Checked in a Python 3.12 environment with the image's versions.
WHEELS = ("datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19", "tokenizers==0.23.3")
# What `run` brings back beside the models (the device tool returns at most 8 files from $OUT, 16 MiB each)
REPORT_FILES = ("report.md",)
PART_BYTES = 15 * 2**20
# The models one call brings back: each about 27 MB in bfloat16 through xz, so 2 parts; with the 3 files above,
# two models make 7 files and a third would make 9, one of which the device tool would leave behind
MAX_MODELS = 2
LEFT_BEHIND = {"checkpoints", "tensorboard", "training_args.bin"}  # of a run folder: not needed to fine-tune
KIT_MARKER = ".real_scale-kit"  # in a kit folder this script made, which pack may then rewrite


def say(message: str) -> None:
    print(f"real_scale: {message}", flush=True)


def write_tar(target: Path, members: dict[str, Path], preset: int = 6) -> None:
    """An xz-compressed tar of `members` (name in the archive -> file), written whole or not at all."""
    with atomic_path(target) as tmp, tarfile.open(tmp, "w:xz", preset=preset) as tar:
        for name, path in members.items():
            tar.add(path, arcname=name)


def text_files(limit_bytes: int | None) -> dict[str, Path]:
    """The training text's files, both sources taking turns, whole files up to `limit_bytes` in all."""
    sources = [sorted((SHARED / source).glob("*.txt")) for source in TEXT_SOURCES]
    chosen, total = {}, 0
    for index in range(max(len(files) for files in sources)):
        for source, files in zip(TEXT_SOURCES, sources, strict=True):
            if index < len(files):
                if limit_bytes is not None and total + files[index].stat().st_size > limit_bytes and chosen:
                    return chosen
                chosen[f"corpus/{source}/{files[index].name}"] = files[index]
                total += files[index].stat().st_size
    return chosen


def train_kit_tokenizer(files: dict[str, Path], kit: Path, vocab_size: int) -> None:
    """The shared tokenizer, trained by convattn itself on the training text, saved in kit/tokenizer."""
    import datasets

    from convattn.data.corpus import load_corpus
    from convattn.data.tokenizer import train_tokenizer

    datasets.disable_progress_bars()

    with tempfile.TemporaryDirectory(dir=kit) as scratch:
        corpus = load_corpus(None, None, [str(path) for path in files.values()], [str(SHARED / "wikitext-103-raw" /
                             EVAL_FILE)], Path(scratch) / "cache")
        tokenizer = train_tokenizer(corpus.train, vocab_size, 128, Path(scratch))
        staged = Path(scratch) / "tokenizer"
        tokenizer.save_pretrained(str(staged))
        shutil.rmtree(kit / "tokenizer", ignore_errors=True)
        staged.replace(kit / "tokenizer")


def download_wheels(kit: Path) -> None:
    wheels = kit / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d", str(wheels),
                    *WHEELS], check=True)


def pack(args) -> int:
    if not SHARED.is_dir():
        sys.exit(f"real_scale pack: {SHARED} is missing: pack runs beside the shared data")
    kit = args.kit
    if kit.is_dir() and any(kit.iterdir()) and not (kit / KIT_MARKER).is_file():
        sys.exit(f"real_scale pack: {kit} holds files this script did not write; give an empty or new --kit")
    kit.mkdir(parents=True, exist_ok=True)
    (kit / KIT_MARKER).touch()
    files = text_files(args.text_mb * 2**20 if args.text_mb else None)
    say(f"training text: {len(files)} files, {sum(p.stat().st_size for p in files.values()) / 2**20:.0f} MiB")
    say(f"training the {args.vocab_size:,}-piece tokenizer on it")
    train_kit_tokenizer(files, kit, args.vocab_size)
    say("compressing the text and GLUE")
    write_tar(kit / "corpus.tar.xz", files)
    glue = {f"glue_data/{folder}/{file.name}": file for folder in GLUE_TASKS.values()
            for file in sorted((SHARED / "glue_data" / folder).glob("*.tsv"))}
    write_tar(kit / "eval.tar.xz", {EVAL_FILE: SHARED / "wikitext-103-raw" / EVAL_FILE, **glue})
    if args.wheels:
        say("downloading the wheels the GPU machine lacks")
        download_wheels(kit)
    size = sum(p.stat().st_size for p in kit.rglob("*") if p.is_file())
    say(f"wrote {kit} ({size / 2**20:.1f} MiB): carry it to the GPU machine")
    return 0


def unpack(kit: Path, work: Path) -> None:
    """The kit's archives under `work`, each unpacked once (into a temporary folder, then renamed)."""
    work.mkdir(parents=True, exist_ok=True)
    for archive, marker in (("corpus.tar.xz", "corpus"), ("eval.tar.xz", EVAL_FILE)):
        if (work / marker).exists():
            continue
        staged = Path(tempfile.mkdtemp(dir=work, prefix=".unpack-"))
        with tarfile.open(kit / archive) as tar:
            tar.extractall(staged, filter="data")
        for item in staged.iterdir():
            item.replace(work / item.name)
        staged.rmdir()


# The call's time: the device tool allows 600 s a command; 540 leaves a minute for what runs before this script
# (benchmarks/gpu.sh's wheel install, which it stamps in CALL_STARTED) and the files' return.
CALL_LIMIT = 540
# Estimates of what the call spends besides training, in seconds, for the plan printed before anything runs; a call
# measures them and its plan.json records those. Unpacking 40 MB of xz and tokenizing 112 MB of text on the GPU
# machine's 16 cores took 4 and 50 s on 2026-11-30 (results/real_scale/call/real_scale-first-call.json):
WARM_PHASE = "the kernel's warm-up, past tokenizing"  # its processes run beside unpacking and tokenizing
ESTIMATES = {"unpack": 5, "prepare": 55, WARM_PHASE: 15}
MODEL_OVERHEAD = 20  # a model's CUDA set-up, build, warm-up and training-memory measurement: 27 s for both on
# 2026-11-30, before `convattn pretrain` warmed the kernel itself (seconds more, from the warm-up's Triton cache)
# The training's wall time per second of its budget: the budget's clock (the GPU's own, steps only) leaves out the
# host's work between steps (the data's masking, the Trainer's callbacks), 11 evaluations of 2,048 examples and 10
# checkpoints. On 2026-11-30's H200, absolute's 165 s took 277 s of progress bar (composite: 1.47; its steps are
# longer); re-measure from a call's compare.log: the bar's elapsed time over its budget.
WALL_PER_BUDGET = 1.7
BRING_BACK = 45  # both models in bfloat16 through xz (about 27 MB each), the report and the status
INTERRUPT_GRACE = 20  # a comparison interrupted at the deadline stops within this (it only ends the step)
MIN_BUDGET = 60  # below this a model trains too little to compare: the call refuses rather than waste the slot
PLAN_FILE = "plan.json"  # in --work: the budget of the first call, which a continuing call must keep


def training_budget(limit: float, spent: float, models: int) -> float:
    """Seconds of training (on the budget's clock) for each of `models` models when `spent` of the call's `limit`
    has gone (unpacking and tokenizing): what remains after every model's overhead, the models' return and the
    interrupt's grace, shared equally, each second of budget taking WALL_PER_BUDGET of the call's."""
    return (limit - spent - BRING_BACK - INTERRUPT_GRACE - models * MODEL_OVERHEAD) / models / WALL_PER_BUDGET


def plan_lines(limit: float, spent: dict, models: int, given: str | None = None) -> tuple[float, list[str]]:
    """The budget per model and the call's plan, phase by phase, from `spent` (phase -> seconds, measured or
    estimated); `given` (--budget, a duration) instead of the budget the limit leaves, the total then saying
    whether it fits."""
    from convattn.training.pretrain.budget import parse_duration

    budget = parse_duration(given) if given else training_budget(limit, sum(spent.values()), models)
    phases = [*((phase, seconds) for phase, seconds in spent.items()),
              *((f"model {k + 1}: training, {budget:.0f} s budget", budget * WALL_PER_BUDGET) for k in range(models)),
              *((f"model {k + 1}: set-up", MODEL_OVERHEAD) for k in range(models)),
              ("interrupt's grace", INTERRUPT_GRACE), ("bringing the models back", BRING_BACK)]
    lines = [f"  {phase:<45} {seconds:6.0f} s" for phase, seconds in phases]
    total = sum(seconds for _, seconds in phases)
    lines.append(f"  {'total (the call allows ' + str(round(limit)) + ' s)':<45} {total:6.0f} s")
    if total > limit + 0.5:
        lines.append(f"  --budget {given} does not fit: the call stops the comparison at its limit, and the next "
                     "call of the same command continues it")
    return budget, lines


def call_started() -> float:
    """When the device call's command began (benchmarks/gpu.sh stamps it), else now, on time.time()'s clock."""
    stamp = os.environ.get("CALL_STARTED")
    try:
        return float(stamp) if stamp else time.time()
    except ValueError:
        return time.time()


def prepare(command: list[str]) -> None:
    """Tokenize and format the comparison's data into its cache, exactly as its first run would (the same options,
    parsed by the command line's own parser), so that the budgets can be set from the time it took."""
    import convattn
    from convattn.cli import build_parser
    from convattn.commands.compare import parse_presets
    from convattn.commands.compare_flags import compare_options
    from convattn.training.compare.grids import grid_from_presets
    from convattn.training.compare.options import run_options
    from convattn.training.pretrain.data import prepare_data
    from convattn.training.pretrain.options import check_options, sequence_length

    convattn.register_auto_classes()
    args = build_parser().parse_args(command[3:])  # after `python -m convattn`
    grid = grid_from_presets(parse_presets(args.presets))
    first = run_options(compare_options(args, grid, Path(args.output_dir)), grid.runs[0], 0)
    prepare_data(first, sequence_length(first.recipe, check_options(first)), None)


def compare_command(args, work: Path, budget: str) -> list[str]:
    smoke = ["--layers", "1", "--hidden", "64", "--heads", "2", "--intermediate", "128", "--batch-size", "8",
             "--eval-samples", "32"] if args.smoke else []
    return [
        sys.executable, "-m", "convattn", "compare", "--presets", args.presets, "--recipe", "chang2021-small",
        "--time-budget", budget, "--warmup", "0.08", "--seeds", "1",
        "--train-file", str(work / "corpus"), "--eval-file", str(work / EVAL_FILE),
        "--tokenizer", str(args.kit / "tokenizer"), "--eval-samples", str(args.eval_samples),
        "--output-dir", str(work / "compare"), "--cache-dir", str(work / "cache"),
        *(["--compile"] if args.compile else []), *smoke,
    ]


def run_until(command: list[str], stop_after: float, log, grace: float = INTERRUPT_GRACE) -> int | None:
    """Run `command` (its output to `log`); interrupt it as Ctrl-C does once `stop_after` seconds have passed.
    Returns its exit code."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        return process.wait(timeout=stop_after)
    except subprocess.TimeoutExpired:
        say(f"{stop_after:.0f} s passed: interrupting the comparison (it keeps its last checkpoint)")
        process.send_signal(signal.SIGINT)
        try:
            return process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()


def machine() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


# --- the fused kernel compiled before any model's training clock starts ----------------------------------------

# The recipe's batches as the fused kernel meets them, those `convattn pretrain` itself warms up on a GPU
# (training/pretrain/warm_up.py): (padded length, the rows' real lengths, repeated over the batch). Compiled here, in
# processes beside tokenizing, the training's own warm-up finds them in Triton's cache and takes seconds.
WARM_BATCHES = tuple(warm_shapes(128))
WARM_PROCESSES = 12  # the GPU machine has 16 cores, which tokenizing shares meanwhile
WARM_LIMIT = 150  # s from the call's start: past it the warm-up stops, and the training compiles what is left
SMOKE_MODEL = {"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128}


def warm_config(preset: str, smoke: bool):
    """The preset's model config as the comparison builds it: the chang2021-small recipe's, SMOKE_MODEL's size with
    `smoke`."""
    from convattn.training.pretrain.options import model_config
    from convattn.training.recipes import load_recipe

    config = model_config(dataclasses.replace(load_recipe("chang2021-small"), preset=preset))
    config.update(SMOKE_MODEL if smoke else {})
    return config


def warm_passes(presets: list[str], batches=WARM_BATCHES, batch_size: int = 128, smoke: bool = False,
                attn_implementation: str | None = None) -> list[str]:
    """One training step and one evaluation forward of each preset's model (the chang2021-small recipe's config,
    SMOKE_MODEL's size with `smoke`, in the training's precision: bfloat16 autocast on a GPU) on each of `batches`:
    the fused kernel's calls the comparison's training and evaluation make (`attn_implementation` chooses another
    than the default). Returns the presets whose passes launched the kernel (on a GPU, those with relative terms,
    under SDPA's name); the others ran SDPA, which compiles nothing."""
    import torch
    from kernel_tilings import launches

    from convattn import ConvAttnForMaskedLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = torch.autocast(device, torch.bfloat16, enabled=device == "cuda")
    warmed = []
    for preset in presets:
        config = warm_config(preset, smoke)
        model = ConvAttnForMaskedLM(config).to(device)
        if attn_implementation:
            model.set_attn_implementation(attn_implementation)
        with launches() as launched:
            passes(model, config, batches, batch_size, device, precision)
        if launched:
            warmed.append(preset)
    return warmed


def passes(model, config, batches, batch_size: int, device: str, precision) -> None:
    """One training step and one evaluation forward of `model` on each of `batches` (random tokens)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    for n, lengths in batches:
        real = torch.tensor([lengths[row % len(lengths)] for row in range(batch_size)])
        mask = (torch.arange(n)[None, :] < real[:, None]).long().to(device)
        ids = torch.randint(5, config.vocab_size, (batch_size, n), generator=generator).to(device)
        model.train()
        with precision:
            loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad(), precision:
            model(input_ids=ids, attention_mask=mask)


def warm(args) -> int:
    """A warm-up process: its units (tiling, batch) compiled without launching anything (kernel_tilings), or with
    --tune every batch launched once, so that each autotuner times its tilings (compiled by then) and leaves its
    picks in Triton's cache for the training."""
    from kernel_tilings import compile_only, pinned_tiling

    presets, start = args.presets.split(","), time.time()
    if args.tune:
        warmed = warm_passes(presets, smoke=args.smoke)
        say(f"warm-up: tuned {', '.join(warmed) or 'nothing (no model takes the kernel)'} in "
            f"{time.time() - start:.0f} s")
        return 0
    for unit in args.units.split(","):
        tiling, batch = (int(part) for part in unit.split(":"))
        began = time.time()
        with pinned_tiling(tiling), compile_only() as compiled:
            warmed = warm_passes(presets, batches=[WARM_BATCHES[batch]], smoke=args.smoke)
        say(f"warm-up: tiling {tiling}, batch {WARM_BATCHES[batch][0]} x {WARM_BATCHES[batch][1]}: "
            f"{len(compiled)} kernels for {', '.join(warmed) or 'no model'} in {time.time() - began:.1f} s")
    return 0


class WarmUp:
    """The warm-up beside unpacking and tokenizing: processes compiling every (tiling, batch) unit side by side, then
    one tuning pass; their lines into `log`. `finish` waits for it until WARM_LIMIT from the call's start, stops
    what is left, and says what it did."""

    def __init__(self, args, log: Path, started: float):
        self.args, self.log, self.deadline = args, log, started + WARM_LIMIT
        self.processes: list[subprocess.Popen] = []
        self.lock, self.stopped = threading.Lock(), False  # no process starts once finish has stopped them
        self.outcome = "not finished"
        self.thread = threading.Thread(target=self._guarded, daemon=True)
        self.thread.start()

    def _guarded(self) -> None:
        try:
            self._run()
        except Exception as error:  # the warm-up is an optimisation: the call goes on, the training compiles
            self.outcome = f"failed: {type(error).__name__}: {error}"[:300]

    def _command(self, *options: str) -> list[str]:
        return [sys.executable, __file__, "warm", "--presets", self.args.presets, *options,
                *(["--smoke"] if self.args.smoke else [])]

    def _run(self) -> None:
        import torch
        from kernel_tilings import tiling_count

        if not torch.cuda.is_available():
            self.outcome = "skipped: no GPU here, so no model takes the kernel"
            return
        configs = [warm_config(preset, self.args.smoke) for preset in self.args.presets.split(",")]
        tilings = max(tiling_count(config.hidden_size // config.num_attention_heads, torch.bfloat16)
                      for config in configs)
        units = [f"{tiling}:{batch}" for tiling in range(tilings) for batch in range(len(WARM_BATCHES))]
        workers = min(len(units), WARM_PROCESSES)
        with open(self.log, "a") as sink:
            for options in ([("--units", ",".join(units[worker::workers])) for worker in range(workers)],
                            [("--tune",)]):
                with self.lock:
                    if self.stopped:
                        return
                    self.processes = [subprocess.Popen(self._command(*option), stdout=sink,
                                                       stderr=subprocess.STDOUT, start_new_session=True)
                                      for option in options]
                codes = [process.wait() for process in self.processes]
                if any(codes):
                    what = "tuning" if options == [("--tune",)] else "compiling"
                    self.outcome = f"{what} failed (exit {max(codes, key=abs)}: {self.log.name})"
                    return
        self.outcome = "done"

    def finish(self) -> str:
        """What it did."""
        self.thread.join(timeout=max(self.deadline - time.time(), 0))
        if self.thread.is_alive():
            with self.lock:
                self.stopped = True
                for process in self.processes:
                    if process.poll() is None:
                        os.killpg(process.pid, signal.SIGKILL)
            self.thread.join()
            self.outcome = f"stopped at {WARM_LIMIT} s from the call's start: the training compiles what is left"
        return self.outcome


def run(args) -> int:
    presets = args.presets.split(",")
    if len(presets) > MAX_MODELS:
        sys.exit(f"real_scale run: --presets names {len(presets)} models; a call brings back at most {MAX_MODELS} "
                 "(8 files of 16 MiB: the report, the log, the status and 2 parts per model): give a later call "
                 "the others")
    if args.dry_run:
        budget, lines = plan_lines(args.limit, ESTIMATES, len(presets), args.budget)
        say(f"the plan (unpacking and tokenizing estimated; a real call measures them first): {budget:.0f} s of "
            "training each")
        print("\n".join(lines))
        return 0
    import torch

    if not torch.cuda.is_available() and not args.smoke:
        sys.exit("real_scale run: no CUDA GPU here (--smoke runs a tiny version on CPU)")
    if not (args.kit / "tokenizer").is_dir():
        sys.exit(f"real_scale run: no kit at {args.kit}: run `python benchmarks/real_scale.py pack` beside "
                 "../shared first and carry the kit")
    work, out = args.work, args.out
    out.mkdir(parents=True, exist_ok=True)
    started = call_started()
    models = len(presets)
    estimate, lines = plan_lines(args.limit, ESTIMATES, models, args.budget)
    say(f"the plan, before anything runs (unpacking and tokenizing estimated): {estimate:.0f} s of training each")
    print("\n".join(lines), flush=True)
    work.mkdir(parents=True, exist_ok=True)
    warmup = WarmUp(args, work / "compare.log", started)  # its lines come back in the call's log
    spent, warmed = {}, {}
    for phase, work_of in (("unpack", lambda: unpack(args.kit, work)),
                           ("prepare", lambda: prepare(compare_command(args, work, "1s"))),
                           (WARM_PHASE, lambda: warmed.update(outcome=warmup.finish()))):
        phase_start = time.time()
        work_of()
        spent[phase] = time.time() - phase_start
    say(f"the kernel's warm-up: {warmed['outcome']} ({spent[WARM_PHASE]:.0f} s past tokenizing)")
    spent = {"before this script": time.time() - started - sum(spent.values()), **spent}
    budget = budget_for_call(args, work, spent, models)
    command = compare_command(args, work, budget)
    say("$ " + " ".join(command))
    stop_after = args.stop_after or started + args.limit - BRING_BACK - INTERRUPT_GRACE - time.time()
    start = time.monotonic()
    with open(work / "compare.log", "a") as log:
        code = run_until(command, stop_after, log)
    report = work / "compare"
    for name in REPORT_FILES:
        if (report / name).is_file():
            shutil.copy(report / name, out / name)
    shutil.copy(work / "compare.log", out / "compare.log")
    brought = bring_back(report, out)
    finished = code == 0
    status = {"finished": finished, "exit_code": code, "seconds": round(time.time() - started, 1),
              "training_call_seconds": round(time.monotonic() - start, 1), "budget": budget,
              "phases": {phase: round(seconds, 1) for phase, seconds in spent.items()},
              "warm_up": warmed["outcome"], "models": brought, "command": command[1:], "machine": machine()}
    write_json_atomic(out / "real_scale.json", status)
    where = "cuda" if status["machine"].get("gpu") else "cpu"
    harness.Run("real_scale", machine=harness.machine_line(where, threads=where == "cpu"), stage="run").save(
        **{name: status[name] for name in ("finished", "exit_code", "seconds", "budget", "models")})
    say(f"exit code {code} after {status['seconds']:.0f} s; report and {len(brought)} models in {out}")
    if finished:
        say("finished")
        return 0
    say("not finished: run the same command again to continue")
    return 3


def budget_for_call(args, work: Path, spent: dict, models: int) -> str:
    """Each model's --time-budget: --budget if given; else the first call's (recorded in PLAN_FILE: a continuing
    call must keep it, or the comparison refuses its runs); else computed from what unpacking and tokenizing took,
    said with the plan."""
    if args.budget:
        _, lines = plan_lines(args.limit, spent, models, args.budget)
        say(f"the plan, measured, with --budget {args.budget} of training each")
        print("\n".join(lines), flush=True)
        return args.budget
    recorded = work / PLAN_FILE
    if recorded.is_file():
        budget = json.loads(recorded.read_text())["budget"]
        say(f"continuing the first call's plan: {budget} of training each")
        return budget
    seconds, lines = plan_lines(args.limit, spent, models)
    if seconds < MIN_BUDGET:
        sys.exit(f"real_scale run: {seconds:.0f} s of training each is left (under {MIN_BUDGET}); the call spent "
                 f"{sum(spent.values()):.0f} s before training")
    budget = f"{int(seconds)}s"
    say(f"the plan, measured: {budget} of training each")
    print("\n".join(lines), flush=True)
    write_json_atomic(recorded, {"budget": budget, "limit": args.limit,
                                 "phases": {phase: round(value, 1) for phase, value in spent.items()}})
    return budget


def bring_back(compare_dir: Path, out: Path) -> list[str]:
    """Each finished row's run folder without its checkpoints, weights in bfloat16, as out/<row>.tar.xz.partNN."""
    import torch
    from safetensors.torch import load_file, save_file

    rows = []
    for run in sorted((compare_dir / "runs").glob("*/seed0")):
        if not (run / "model.safetensors").is_file():
            continue
        row = run.parent.name
        with tempfile.TemporaryDirectory() as scratch:
            weights = Path(scratch) / "model.safetensors"
            tensors = load_file(run / "model.safetensors")
            save_file({name: t.to(torch.bfloat16) if t.is_floating_point() else t for name, t in tensors.items()},
                      weights, metadata={"format": "pt"})
            members = {f"{row}/{item.name}": item for item in sorted(run.iterdir())
                       if item.is_file() and item.name not in LEFT_BEHIND and item.name != "model.safetensors"}
            members[f"{row}/model.safetensors"] = weights
            archive = Path(scratch) / f"{row}.tar.xz"
            write_tar(archive, members, preset=3)
            split(archive, out)
        rows.append(row)
    return rows


def split(archive: Path, out: Path) -> None:
    """archive as out/<name>.part00, .part01, ... of at most PART_BYTES each (older parts of it removed)."""
    for stale in out.glob(f"{archive.name}.part*"):
        stale.unlink()
    with open(archive, "rb") as source:
        for index, chunk in enumerate(iter(lambda: source.read(PART_BYTES), b"")):
            with atomic_path(out / f"{archive.name}.part{index:02d}") as tmp:
                tmp.write_bytes(chunk)


def join_models(parts: Path, models: Path) -> list[Path]:
    """The models of the parts in `parts`, unpacked under `models` (once), their weights back in float32."""
    from safetensors.torch import load_file, save_file

    archives = sorted({part.name.rsplit(".part", 1)[0] for part in parts.glob("*.tar.xz.part*")})
    if not archives:
        sys.exit(f"real_scale glue: no <row>.tar.xz.partNN files in {parts}: give the `run` call's files")
    models.mkdir(parents=True, exist_ok=True)
    unpacked = []
    for name in archives:
        model = models / name.removesuffix(".tar.xz")
        if model.exists() and not (model / "model.safetensors").is_file():
            sys.exit(f"real_scale glue: {model} is not a model this script unpacked: move it away or give another "
                     "--work")
        if not model.exists():
            staged = Path(tempfile.mkdtemp(dir=models, prefix=".unpack-"))
            joined = staged / name
            with open(joined, "wb") as target:
                for part in sorted(parts.glob(f"{name}.part*")):
                    target.write(part.read_bytes())
            with tarfile.open(joined) as tar:
                tar.extractall(staged, filter="data")
            folder = staged / model.name
            tensors = load_file(folder / "model.safetensors")
            save_file({key: t.float() if t.is_floating_point() else t for key, t in tensors.items()},
                      folder / "model.safetensors", metadata={"format": "pt"})
            folder.replace(model)
            shutil.rmtree(staged)
        unpacked.append(model)
    return unpacked


def glue(args) -> int:
    data = args.data_dir or (SHARED / "glue_data")
    if not data.is_dir():
        sys.exit(f"real_scale glue: no GLUE data at {data}: give --data-dir")
    models = [model for folder in args.models for model in join_models(folder, args.work / "models")]
    args.out.mkdir(parents=True, exist_ok=True)
    # glue.json keeps every model fine-tuned into --out: a later call's model (rotary beside 9.6's two) joins the
    # table without its predecessors' hours of fine-tuning again; a model given again is run again, in its place
    kept = args.out / "glue.json"
    results = json.loads(kept.read_text()) if kept.is_file() else {}
    for model in models:
        command = [sys.executable, "-m", "convattn", "glue", "--model", str(model), "--task", args.tasks,
                   "--data-dir", str(data), "--seeds", str(args.seeds), "--output-dir",
                   str(args.work / "glue" / model.name), "--max-train-samples", str(args.max_train_samples),
                   *(["--max-steps", str(args.max_steps)] if args.max_steps else [])]
        say("$ " + " ".join(command))
        subprocess.run(command, cwd=ROOT, check=True)
        result = json.loads((args.work / "glue" / model.name / GLUE_RESULTS).read_text())
        results[model.name] = result | {"pretraining": last_evaluation(model)}
    write_json_atomic(args.out / "glue.json", results)
    run = harness.Run("real_scale", stage="glue", tasks=args.tasks, seeds=args.seeds)
    for model in models:
        run.add(model=model.name, glue=results[model.name]["glue"], columns=results[model.name]["columns"])
    run.save()
    with atomic_path(args.out / "glue.md") as tmp:
        tmp.write_text(glue_table(results))
    say(f"GLUE of {len(models)} models ({len(results)} in the table) in {args.out / 'glue.md'}")
    return 0


# Chang et al. 2021's BERT-small rows (../shared/papers/chang2021-convolutions-and-self-attention.txt), by preset:
# GLUE dev, mean and SEM over ten fine-tuning runs (their Table 6; the three tasks run here), and the test-set GLUE
# of all nine tasks (their Table 1). Pretrained 125,000 steps x 128 pairs x 128 tokens.
PAPER_DEV = {
    "none": {"CoLA": (7.0, 2.4), "MRPC": (80.9, 0.4), "SST": (80.9, 0.9)},
    "absolute": {"CoLA": (33.5, 0.4), "MRPC": (83.3, 0.4), "SST": (85.0, 0.2)},
    "fixed": {"CoLA": (38.3, 0.8), "MRPC": (84.0, 0.5), "SST": (86.9, 0.2)},
    "dynamic": {"CoLA": (38.4, 0.7), "MRPC": (85.6, 0.5), "SST": (86.8, 0.2)},
    "composite": {"CoLA": (40.9, 0.7), "MRPC": (86.2, 0.3), "SST": (86.9, 0.1)},
    "composite+key": {"CoLA": (40.0, 0.6), "MRPC": (86.3, 0.3), "SST": (86.5, 0.3)},
}
PAPER_TEST_GLUE = {"none": 68.4, "absolute": 71.1, "fixed": 74.5, "dynamic": 74.7, "composite": 75.2}
PAPER_TOKENS = 125_000 * 128 * 128  # token positions of their pretraining, padding included


def glue_table(results: dict) -> str:
    """Each model's GLUE dev scores (glue_results.json's columns, already x 100: mean ± SEM over the fine-tuning
    seeds) beside Chang et al.'s row of its preset, and its pretraining's last evaluation (its "pretraining")."""
    columns = list(dict.fromkeys(column for result in results.values() for column in result["columns"]))
    lines = ["# The real-scale models beside Chang et al. (2021)", "",
             "`python benchmarks/real_scale.py glue`. GLUE dev x 100, mean ± SEM over fine-tuning seeds (ours: the "
             "n given; Chang et al.: ten, their Table 6). Mean: of the columns shown, per seed (ours) or of the "
             "column means (theirs). CoLA: MCC; MRPC: mean of accuracy and F1; SST: accuracy. Their test GLUE "
             "(Table 1) averages all nine tasks. Pretraining: the model's last evaluation (eval perplexity on the "
             "held-out text, optimizer steps, real tokens seen, training compute time); theirs 125,000 steps of 128 "
             f"x 128 token positions ({PAPER_TOKENS / 1e9:.2f}B, padding included).", "",
             "| model | source | " + " | ".join(columns) + " | mean | test GLUE (9 tasks) | eval perplexity | steps | "
             "tokens seen | training time |",
             "|---|---|" + "---:|" * (len(columns) + 6)]
    for row, result in results.items():
        preset = row.split("--", 1)[-1]
        cells = [*(score(result["columns"].get(column)) for column in columns), score(result["glue"]), "–",
                 *pretraining_cells(result.get("pretraining"))]
        lines.append(f"| {row} | ours | {' | '.join(cells)} |")
        if preset in PAPER_DEV:
            paper = PAPER_DEV[preset]
            means = [paper[column][0] for column in columns if column in paper]
            mean = f"{sum(means) / len(means):.1f}" if len(means) == len(columns) else "–"
            cells = [f"{paper[column][0]:.1f} ± {paper[column][1]:.1f}" if column in paper else "–"
                     for column in columns]
            lines.append(f"| {row} | Chang et al. | {' | '.join(cells)} | {mean} | "
                         f"{PAPER_TEST_GLUE.get(preset, '–')} | – | 125,000 | {PAPER_TOKENS / 1e9:.2f}B | – |")
    return "\n".join(lines) + "\n"


def last_evaluation(model: Path) -> dict | None:
    """The last evaluation the model's pretraining logged (its metrics.jsonl), None where it logged none."""
    path = model / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    evaluations = [entry for entry in map(json.loads, lines) if "perplexity" in entry]
    return evaluations[-1] if evaluations else None


def pretraining_cells(last: dict | None) -> list[str]:
    """Eval perplexity, steps, tokens seen and training time at the pretraining's last evaluation; dashes without
    one."""
    if not last:
        return ["–"] * 4
    tokens = last["tokens_seen"]
    return [f"{last['perplexity']:.1f}", f"{last['step']:,}", f"{tokens / 1e6:.1f}M ({tokens / PAPER_TOKENS:.1%} of "
            "theirs)", f"{last['training_compute_seconds']:.0f} s"]


def score(stat: dict | None) -> str:
    """A glue_results.json entry (already x 100): mean ± SEM (n seeds)."""
    return f"{format_mean_sem(stat)} (n {stat['n']})" if stat else "–"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    stages = parser.add_subparsers(dest="stage", required=True)
    packing = stages.add_parser("pack", help="here: write the kit the GPU machine needs")
    packing.add_argument("--text-mb", type=int, help="at most this much training text (default: all of it)")
    packing.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    packing.add_argument("--no-wheels", dest="wheels", action="store_false", help="skip downloading the wheels")
    unpacking = stages.add_parser("unpack", help="on the GPU machine: only unpack the kit into --work")
    running = stages.add_parser("run", help="on the GPU machine: run or continue the comparison")
    running.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", WORK / "out")),
                         help="where the report goes (default: $OUT)")
    running.add_argument("--budget", help="training time of each model (default: what the call's --limit leaves, "
                                           "computed once unpacking and tokenizing have been timed)")
    running.add_argument("--limit", type=float, default=CALL_LIMIT,
                         help=f"seconds the whole call may take, from gpu.sh's start (default: {CALL_LIMIT})")
    running.add_argument("--stop-after", type=float,
                         help="interrupt the comparison after this many seconds (default: what leaves time to bring "
                              "the models back inside --limit)")
    running.add_argument("--presets", default=PRESETS,
                         help="the models, trained one after another for the same time (default: %(default)s; "
                              "rotary beside the 2026-11-30 call's two: chang2021-small/rotary --budget 165s)")
    running.add_argument("--dry-run", action="store_true", help="print the plan with estimated phases, run nothing")
    running.add_argument("--eval-samples", type=int, default=2048)
    running.add_argument("--compile", action="store_true", help="torch.compile the models")
    running.add_argument("--smoke", action="store_true", help="a tiny model that runs on CPU (tests)")
    warming = stages.add_parser("warm", help="(run starts these) compile the fused kernel for the training's batches")
    warming.add_argument("--presets", default=PRESETS)
    warming.add_argument("--units", default="0:0", help="tiling:batch pairs to compile, comma-separated")
    warming.add_argument("--tune", action="store_true", help="launch every batch once: the autotuners' picks")
    warming.add_argument("--smoke", action="store_true", help="the tiny model (tests)")
    finetuning = stages.add_parser("glue", help="here: GLUE dev of the models a `run` call brought back")
    finetuning.add_argument("--models", type=Path, action="append", required=True,
                            help="a folder holding a run call's files (again for another call's: their models join "
                                 "the models already in --out's glue.json)")
    finetuning.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "real_scale",
                            help="where glue.md and glue.json go")
    finetuning.add_argument("--tasks", default=",".join(GLUE_TASKS))
    finetuning.add_argument("--seeds", type=int, default=3)
    finetuning.add_argument("--max-train-samples", type=int, default=20000)
    finetuning.add_argument("--max-steps", type=int, help="fine-tuning steps per run (tests)")
    finetuning.add_argument("--data-dir", type=Path, help="GLUE TSVs (default: ../shared/data/glue_data)")
    for stage in (unpacking, running, finetuning):
        stage.add_argument("--work", type=Path, default=WORK)
    for stage in (packing, unpacking, running):
        stage.add_argument("--kit", type=Path, default=KIT)
    args = parser.parse_args()
    if args.stage == "unpack":
        unpack(args.kit, args.work)
        return 0
    return {"pack": pack, "run": run, "warm": warm, "glue": glue}[args.stage](args)


if __name__ == "__main__":
    sys.exit(main())
