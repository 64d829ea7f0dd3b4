"""The product's own training step (issue 47, item 4d), stage "train" of benchmarks/gpu_session.py: `convattn pretrain`
at the chang2021-small recipe's shape (12 layers, hidden 256, 4 heads, 128 tokens, vocabulary 30,004, masked LM on
line pairs) on CUDA in bf16, chang2021-small/composite (the fused kernel) against chang2021-small/absolute (SDPA)
and transformers' BertForMaskedLM of the same shape (SDPA) trained by transformers' own Trainer, at two batches,
in three modes: eager, compiled (`--compile-mode default`, as `--compile`: inductor's kernels, launched by the
host) and graphs (`--compile-mode reduce-overhead`: the same kernels replayed as CUDA graphs). Issue 62's order
(`rows`): batch 128 first, composite and absolute before BERT, graphs, eager, then compiled. A compiled run records
its graph breaks and cudagraph skips with their reasons (`compile_events`); a graphs row with any is "not graphed".

Each `convattn pretrain` runs in the stage's process through the command line's own entry (convattn.cli.main), one
after another; harness.StepMeter, a TrainerCallback added to every transformers.Trainer the process builds, measures the
steps:

  warm-up   the first steps (compilation, the allocator's first growth, recompilation for a new length);
  timed     the next steps, synchronised at both ends: milliseconds per step, tokens per second (the Trainer's own
            count of tokens that are not padding), and the allocator's peak since training began (the time from the
            start of training to the end of step 1, its first evaluation and the compilation included, beside);
  profiled  a few steps more under torch.profiler: the device's kernel time per step (the sum of its kernels,
            copies and memsets) over the timed steps' wall time is the device's busy share.

The corpus is tokenized beforehand, outside every timed step: the first run formats it into the session's cache and
the others read it from there. On the GPU machine (no network, no `datasets`) the corpus, the recipe's 30,004-piece
tokenizer and the wheels of `datasets` come from the kit that `python benchmarks/real_scale.py pack` makes here
(.gpu-kit/, carried with the device call; gpu_session.sh installs its wheels): the first few megabytes of its
Wikipedia text. The BERT arm trains on the examples the first `convattn pretrain` run formatted, with the same
tokenizer, batch, precision, optimizer (fused AdamW) and masking (15 %, padded to a multiple of 8). Rehearsed on
CPU: a 2-layer model of hidden 64 on random words, 32 tokens, fp32, eager only (compiling takes minutes there).
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import harness
from harness import NotMeasured, metered, step_meter

# torch and transformers are imported where a run needs them: gpu_session.py's own process reads the plans here

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / ".gpu-kit"  # benchmarks/real_scale.py pack: tokenizer/, corpus.tar.xz, wheels/
# of Wikipedia text: about 19,000 lines, 9,500 examples of two lines each (most cut to 128 tokens), 18 steps of 512
# examples an epoch (the Trainer goes round again), tokenized in seconds
CORPUS_BYTES = 8 * 2**20
PRESETS = {"composite": "chang2021-small/composite", "absolute": "chang2021-small/absolute"}
ARMS = (*PRESETS, "bert")
# each mode's torch.compile mode (None: eager), for `convattn pretrain --compile-mode` and BERT's TrainingArguments
MODES = {"eager": None, "compiled": "default", "graphs": "reduce-overhead"}
WORDS = "the of and to in a is was for on as with by he at from his an were are city film year war king".split()  # noqa: SIM905


@dataclass(frozen=True)
class TrainPlan:
    precision: str  # `convattn pretrain --precision`
    batches: tuple[int, ...]
    warmup: dict  # steps before the timed ones, per mode
    timed: int
    profiled: int
    flags: tuple[str, ...] = ()  # beside the recipe's: the rehearsal's tiny model and data
    architecture: dict = field(default_factory=dict)  # the same, as config fields (the BERT arm's)
    least_seconds: dict = field(default_factory=dict)  # a row starts only with this much of the stage's time left
    compile_skipped: str | None = None  # why the compiled rows are not run (the rehearsal)
    eval_samples: int = 16

    def steps(self, mode: str) -> int:
        return self.warmup[mode] + self.timed + self.profiled


GPU_TRAIN = TrainPlan("bf16", (128, 512), {"eager": 4, "compiled": 10, "graphs": 10}, timed=20, profiled=3,
                      least_seconds={"eager": 12, "compiled": 45, "graphs": 25})
TINY = {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 128, "embedding-size": 32}
# one batch: the GPU's later batch runs the same rows' code again, with the time left
REHEARSAL_TRAIN = TrainPlan(
    "fp32", (4,), {"eager": 1, "compiled": 1, "graphs": 1}, timed=2, profiled=1,
    flags=(*(item for name, value in TINY.items() for item in (f"--{name}", str(value))), "--vocab-size", "150",
           "--seq-len", "32"),
    compile_skipped="the rehearsal does not compile: torch.compile of a model takes minutes on this CPU")


# the modes in the order they run at each batch: CUDA graphs first (the answer to the host's cost per launch), eager,
# then compiled
ORDER = ("graphs", "eager", "compiled")


def rows(plan: TrainPlan) -> list[dict]:
    """The runs in the order they go (issue 62): batch by batch, the first (128) first; at each, composite and
    absolute (the bars' pair) in ORDER, then BertForMaskedLM in ORDER. The later batches run with the time left."""
    return [dict(mode=mode, batch=batch, arm=arm) for batch in plan.batches
            for arms in (tuple(PRESETS), ("bert",)) for mode in ORDER for arm in arms]


# --- the corpus -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Corpus:
    train: Path
    tokenizer: Path | None  # None: `convattn pretrain` trains one (the rehearsal)


def corpus(work: Path, rehearse: bool, kit: Path = KIT) -> Corpus:
    """The session's corpus in `work` (written once): random words in a rehearsal, else the kit's first
    CORPUS_BYTES of Wikipedia lines and its tokenizer."""
    import importlib.util

    if importlib.util.find_spec("datasets") is None:
        raise NotMeasured("`convattn pretrain` needs `datasets`, which this machine lacks: carry .gpu-kit (made by "
                          "`python benchmarks/real_scale.py pack`) with the call; gpu_session.sh installs its wheels")
    folder = work / "corpus"
    if rehearse:
        if not folder.is_dir():
            rng = random.Random(0)
            lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) for _ in range(600)]
            staged = Path(tempfile.mkdtemp(dir=work))
            (staged / "train.txt").write_text("\n".join(lines) + "\n")
            staged.replace(folder)
        return Corpus(folder, None)
    if not (kit / "tokenizer").is_dir() or not (kit / "corpus.tar.xz").is_file():
        raise NotMeasured(f"no kit at {kit} (tokenizer/, corpus.tar.xz): make it with `python benchmarks/"
                          "real_scale.py pack` and carry .gpu-kit with the call")
    if not folder.is_dir():
        staged = Path(tempfile.mkdtemp(dir=work))
        total = 0
        with tarfile.open(kit / "corpus.tar.xz", "r|xz") as tar:  # a stream: the archive is read once, in order
            for member in tar:
                if total >= CORPUS_BYTES:
                    break
                if not member.isfile() or "enwiki" not in member.name:  # Wikipedia's paragraphs, not books' lines
                    continue
                text = tar.extractfile(member).read()[:CORPUS_BYTES - total]
                text = text[:text.rfind(b"\n") + 1]
                if not text:  # what was left of the budget ends inside the file's first line: no file at all
                    break  # (`convattn pretrain` refuses an empty one: the 2026-11-30 call's training stage)
                (staged / Path(member.name).name).write_bytes(text)
                total += len(text)
        if total == 0:
            raise NotMeasured(f"{kit / 'corpus.tar.xz'} holds no enwiki text")
        staged.replace(folder)
    return Corpus(folder, kit / "tokenizer")


# --- measuring the steps --------------------------------------------------------------------------------------------

class _SkipReasons:
    """Stands in for torch._inductor.cudagraph_utils' log while a run compiles: keeps each message it warns with
    (inductor's reason for each cudagraph skip) and passes everything on."""

    def __init__(self, log, reasons: list[str]):
        self._log, self._reasons = log, reasons

    def warning(self, message, *args, **kwargs):
        self._reasons.append(" ".join(str(message % args if args else message).split())[:200])
        return self._log.warning(message, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._log, name)


@contextlib.contextmanager
def compile_events():
    """What torch.compile did to a run's step, filled in as the block ends: graph breaks (torch._dynamo's
    counters["graph_break"], a count per reason), cudagraph skips (counters["inductor"]["cudagraph_skips"]) and the
    reasons inductor logged for them (the log of torch._inductor.cudagraph_utils, where
    log_cudagraph_skip_and_bump_counter warns; a skip counted elsewhere has none). Counted from the block's start;
    "unknown" where this torch does not say."""
    events: dict = {}
    try:
        from torch._dynamo.utils import counters
        from torch._inductor import cudagraph_utils
    except ImportError as error:
        events["compile_events"] = f"unknown: {error}"
        yield events
        return
    breaks, skips = Counter(counters["graph_break"]), counters["inductor"]["cudagraph_skips"]
    reasons: list[str] = []
    log = getattr(cudagraph_utils, "cudagraphs_log", None)
    if log is not None:
        cudagraph_utils.cudagraphs_log = _SkipReasons(log, reasons)
    try:
        yield events
    finally:
        if log is not None:
            cudagraph_utils.cudagraphs_log = log
        new_breaks = Counter(counters["graph_break"]) - breaks
        events.update(graph_breaks=sum(new_breaks.values()),
                      graph_break_reasons=[" ".join(str(reason).split())[:200]
                                           for reason, _ in new_breaks.most_common(3)],
                      cudagraph_skips=counters["inductor"]["cudagraph_skips"] - skips,
                      cudagraph_skip_reasons=reasons[:3])


def not_graphed(events: dict) -> str | None:
    """Why a graphs row's step was not (wholly) replayed as CUDA graphs; None where nothing says so."""
    said = []
    if events.get("cudagraph_skips"):
        reasons = events.get("cudagraph_skip_reasons") or ["no reason logged"]
        said.append(f"{events['cudagraph_skips']} cudagraph skips ({reasons[0]})")
    if events.get("graph_breaks"):
        said.append(f"{events['graph_breaks']} graph breaks ({events['graph_break_reasons'][0]})")
    return f"not graphed: {'; '.join(said)}"[:300] if said else None


class Tee(io.TextIOBase):
    """Writes to a stream and keeps the last lines (an in-process command's error, for its row)."""

    def __init__(self, stream):
        self.stream, self.tail = stream, ""

    def write(self, text: str) -> int:
        self.tail = (self.tail + text)[-4000:]
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


# --- the runs ---------------------------------------------------------------------------------------------------

def convattn_argv(row: dict, plan: TrainPlan, data: Corpus, work: Path, output: Path) -> list[str]:
    steps, compile_mode = plan.steps(row["mode"]), MODES[row["mode"]]
    never = str(10**6)  # no evaluation or checkpoint between the steps; the run's final evaluation and save stay
    return ["pretrain", "--preset", PRESETS[row["arm"]], "--recipe", "chang2021-small",
            "--train-file", str(data.train), *(["--tokenizer", str(data.tokenizer)] if data.tokenizer else []),
            "--cache-dir", str(work / "cache"), "--output-dir", str(output), "--batch-size", str(row["batch"]),
            "--max-steps", str(steps), "--warmup", "1", "--eval-every", never, "--save-every", never,
            "--log-every", str(steps), "--eval-samples", str(plan.eval_samples), "--precision", plan.precision,
            "--seed", "0", *(["--compile-mode", compile_mode] if compile_mode else []), *plan.flags]


def run_convattn(row: dict, plan: TrainPlan, data: Corpus, work: Path, meter: harness.StepMeter) -> None:
    from convattn.cli import main

    output = Path(tempfile.mkdtemp(dir=work, prefix="run-"))
    argv = convattn_argv(row, plan, data, work, output)
    print("$ convattn", " ".join(argv), flush=True)
    tee = Tee(sys.stderr)
    try:
        with metered(meter), contextlib.redirect_stderr(tee):
            code = main(argv)
    finally:
        shutil.rmtree(output, ignore_errors=True)
    if code != 0:
        said = [line for line in tee.tail.splitlines() if "error" in line] or tee.tail.splitlines()[-1:]
        raise RuntimeError(f"convattn pretrain exited {code}: {(said or [''])[-1].strip()}")


def run_bert(row: dict, plan: TrainPlan, work: Path, meter: harness.StepMeter) -> None:
    """transformers' BertForMaskedLM (SDPA) of the product model's shape, trained by transformers' Trainer on the
    examples the first convattn run saved."""
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM, set_seed

    saved = work / "examples"
    if not (saved / "model.json").exists():
        raise NotMeasured("no convattn run saved its examples before it (the BERT arm trains on them)")
    shape = json.loads((saved / "model.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(saved / "tokenizer"))
    examples = torch.load(saved / "examples.pt")
    config = harness.bert_config(shape, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    set_seed(0)
    model = BertForMaskedLM(config)
    with tempfile.TemporaryDirectory(dir=work) as output:
        trainer = harness.bert_trainer(
            model, tokenizer, examples, output, steps=plan.steps(row["mode"]), batch=row["batch"],
            precision=plan.precision, compile_mode=MODES[row["mode"]], callbacks=[meter], learning_rate=3e-4,
            weight_decay=0.01, warmup_steps=1, max_grad_norm=1.0, include_num_input_tokens_seen="non_padding")
        trainer.train()


def measure(row: dict, plan: TrainPlan, work: Path, deadline: float, rehearse: bool, kit: Path = KIT) -> dict:
    """One row of the stage: a run of `row["arm"]` at its batch and mode, measured by a StepMeter."""
    if row["mode"] != "eager" and plan.compile_skipped:
        return {"error": f"skipped: {plan.compile_skipped}"}
    least = plan.least_seconds.get(row["mode"], 0)
    if deadline - time.time() < least:
        return {"error": f"not measured: under {least} s of the stage's time left for a {row['mode']} run"}
    work.mkdir(parents=True, exist_ok=True)
    try:
        data = corpus(work, rehearse, kit)
    except NotMeasured as reason:
        return {"error": f"not measured: {reason}"}
    capture = work / "examples" if row["arm"] != "bert" else None
    meter = step_meter(plan.warmup[row["mode"]], plan.timed, plan.profiled, deadline, capture,
                       examples=max(plan.steps(mode) for mode in plan.warmup) * max(plan.batches))
    compiled = row["mode"] != "eager"
    try:
        with compile_events() if compiled else contextlib.nullcontext({}) as events:
            if row["arm"] == "bert":
                run_bert(row, plan, work, meter)
            else:
                run_convattn(row, plan, data, work, meter)
        result = meter.measured()
        if compiled:
            result.update(events)
            if row["mode"] == "graphs" and not_graphed(events):
                result["not_graphed"] = not_graphed(events)
        return result
    except NotMeasured as reason:
        return {"error": f"not measured: {reason}"}
    finally:
        import gc

        import torch

        gc.collect()
        if row["mode"] != "eager":
            torch.compiler.reset()  # the compiled graphs hold the run's model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
