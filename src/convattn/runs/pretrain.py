"""A pretraining run's folder: the names of what it writes, its checkpoints, its metrics, and the state it is in.

    config.json, model.safetensors, tokenizer files   the final model (saved last)
    metrics.jsonl                                     one row per evaluation
    perplexity.png                                    eval perplexity vs steps
    tensorboard/                                      TensorBoard event files
    checkpoints/checkpoint-N/                         for --resume (the Trainer's own checkpoints)
    pretrain_options.json                             what was run (written before training starts)
    pretrain_data.json                                a fingerprint of its text, the vocabulary size built
    .replaced-run/                                    the run an --overwrite replaces, until the new one stands

`run_state` is the one answer to "what state is this run in"; `remove_run_files` removes only what a run wrote;
`check_same_data` holds the data a --resume reads against the run's record of it (`recorded_data`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from convattn.console import LOG_FILE
from convattn.errors import UsageError, option
from convattn.files import read_json
from convattn.runs.environment import ENVIRONMENT_FILE
from convattn.runs.folder import (
    LOCK_FILE,
    PARTIAL,
    REPLACED,
    foreign_entries,
    holds_only_lock,
    is_code_or_temp,
)
from convattn.runs.plots import PLOTS_DIR, written_by_plot
from convattn.runs.replace import JobLayout

OPTIONS_FILE = "pretrain_options.json"
DATA_FILE = "pretrain_data.json"  # the text the run started with (its fingerprint), checked on --resume
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "perplexity.png"
CARD_FILE = "README.md"
FINAL_MODEL = "model.safetensors"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
DISCRIMINATOR = "discriminator"  # ELECTRA runs: the encoder to fine-tune
FINAL_TMP = ".final.tmp"  # the final model while it is written
TRAINER_STATE = "trainer_state.json"  # in each checkpoint; the Trainer writes it last

# what a model folder holds: the final model, a checkpoint, discriminator/ (`save_pretrained` of a model and of a
# tokenizer, ours or any HF one given with --tokenizer)
MODEL_FILES = frozenset({
    "config.json", "generation_config.json", FINAL_MODEL, "training_args.bin",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
    "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
})
# what a checkpoint holds beyond that: the Trainer's state (and rng_state.pth, or one rng_state_<rank>.pth a process)
TRAINER_STATE_FILES = frozenset({"optimizer.pt", "scheduler.pt", "scaler.pt", TRAINER_STATE})
RNG_STATE = re.compile(r"rng_state(_\d+)?\.pth")
CHECKPOINT_NAME = re.compile(r"(tmp-)?checkpoint-\d+")
# what a pretraining run writes into its folder: all that --overwrite may remove
# (and plots/, the figures `convattn plot` draws of the run by default)
# what a comparison writes into a finished run's folder from its model: the scores at each length
# (training/compare/lengths.py) and --glue / --squad's fine-tuning folders (runs/finetune.py: glue_dir, squad_dir),
# which an --overwrite sets aside with the run they score
LENGTHS_FILE, GLUE_DIR, SQUAD_DIR = "length_eval.json", "glue", "squad"
RUN_ENTRIES = MODEL_FILES | {OPTIONS_FILE, DATA_FILE, METRICS_FILE, LOG_FILE, CARD_FILE, PLOT_FILE, TENSORBOARD,
                             CHECKPOINTS, DISCRIMINATOR, FINAL_TMP, LOCK_FILE, REPLACED, PARTIAL, PLOTS_DIR,
                             ENVIRONMENT_FILE, LENGTHS_FILE, GLUE_DIR, SQUAD_DIR}

EMPTY, UNSTARTED, IN_PROGRESS, FINISHED = "empty", "unstarted", "in progress", "finished"
NOT_A_RUN = "not a run"


# max_steps of a time-budget run that no step count ends, as its options file said before it said null: the number
# those files hold, which stays whatever MAX_STEPS (the same number today) becomes
LEGACY_NO_STEP_LIMIT = 1_000_000_000
# the clock of a time-budget run recorded before the options file named one (budget_clock): the wall's
LEGACY_CLOCK = "wall"


def recorded_options(file: Path) -> dict | None:
    """The options a run recorded in `file` (None: no such file), as this version writes them; one line naming the
    file when it is not the JSON object convattn writes."""
    try:
        saved = read_json(file)
    except (ValueError, UnicodeDecodeError) as err:
        raise UsageError(f"{file} is damaged or not written by convattn (not JSON: {str(err)[:80]}); restore it, "
                         f"or start a new run in another {option('output_dir')}") from None
    if saved is not None and not isinstance(saved, dict):
        raise UsageError(f"{file} is damaged or not written by convattn (a JSON {type(saved).__name__}, not the "
                         f"run's options); restore it, or start a new run in another {option('output_dir')}")
    if saved is None:
        return None
    if saved.get("time_budget") is not None and saved.get("max_steps") == LEGACY_NO_STEP_LIMIT:
        saved = {**saved, "max_steps": None}
    if "budget_clock" not in saved:  # recorded before the budget had a choice of clock: it counted the wall's time
        saved = {**saved, "budget_clock": LEGACY_CLOCK if saved.get("time_budget") is not None else "compute"}
    return saved


def run_state(out: Path) -> str:
    """EMPTY: no folder, or only a lock file. FINISHED: the final model is saved (a run saves it last).
    IN_PROGRESS: a complete checkpoint to --resume from. UNSTARTED: the options are recorded, nothing is saved
    (a run that stopped before its first checkpoint: the same command starts it again). NOT_A_RUN: anything else."""
    out = Path(out)
    if not out.is_dir() or holds_only_lock(out):
        return EMPTY
    if (out / FINAL_MODEL).is_file():
        return FINISHED
    if complete_checkpoints(checkpoints_dir(out)):
        return IN_PROGRESS
    return UNSTARTED if (out / OPTIONS_FILE).is_file() else NOT_A_RUN


def has_saved(out: Path) -> bool:
    """The run saved something to continue from or to use: a complete checkpoint or its final model."""
    return run_state(out) in (IN_PROGRESS, FINISHED)


def checkpoints_dir(out: Path) -> Path:
    return Path(out) / CHECKPOINTS


def complete_checkpoints(directory: Path) -> list[Path]:
    """The checkpoints in `directory` (a run's `checkpoints_dir`) whose trainer state was written (the Trainer
    writes it last), oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.glob("checkpoint-*")
             if p.name.removeprefix("checkpoint-").isdigit() and (p / TRAINER_STATE).exists()]
    return sorted(found, key=checkpoint_step)


def checkpoint_step(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix("checkpoint-"))


def read_metrics(out: Path) -> list[dict]:
    """The rows of the run's METRICS_FILE (one per evaluation); [] before the first. One line naming the file, the
    line and the field when a line is not a JSON object (any line, first), or a row's field not what the run
    writes (METRICS_FIELDS)."""
    file = Path(out) / METRICS_FILE
    if not file.is_file():
        return []
    lines = [(f"{file}:{number}", line)
             for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1) if line.strip()]
    rows = [(where, _metrics_row(line, where)) for where, line in lines]
    for where, row in rows:
        if problem := field_problem(row, METRICS_FIELDS, METRICS_REQUIRED):
            raise UsageError(f"{where}: {problem}; the file is damaged: delete that line, or start a new run in "
                             f"another {option('output_dir')}")
    return [row for _, row in rows]


def _metrics_row(line: str, where: str) -> dict:
    """One row of a metrics file; one line naming the file and line that is not a JSON object."""
    try:
        row = json.loads(line)
    except ValueError as err:
        row = err
    if not isinstance(row, dict):
        raise UsageError(f"{where}: not a metrics row (a JSON object per line); the file is damaged: delete that "
                         f"line, or start a new run in another {option('output_dir')}")
    return row


# ---------------------------------------------------------------------------------- the fields of run files
INTEGER, NUMBER, NUMBER_OR_NULL, TEXT = "an integer", "a finite number", "a finite number or null", "a string"


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


KINDS = {
    INTEGER: lambda value: isinstance(value, int) and not isinstance(value, bool),
    NUMBER: _is_number,
    NUMBER_OR_NULL: lambda value: value is None or _is_number(value),
    TEXT: lambda value: isinstance(value, str),
}
# a metrics row: what `MetricsWriter` writes (null: nothing measured since the last evaluation); step and
# perplexity are what every reader needs
METRICS_FIELDS = {
    "step": INTEGER, "perplexity": NUMBER, "eval_loss": NUMBER, "train_loss": NUMBER_OR_NULL,
    "tokens_per_second": NUMBER_OR_NULL, "learning_rate": NUMBER_OR_NULL, "tokens_seen": INTEGER,
    "elapsed_seconds": NUMBER, "training_seconds": NUMBER, "generator_loss": NUMBER, "discriminator_loss": NUMBER,
    "discriminator_accuracy": NUMBER,
}
METRICS_REQUIRED = ("step", "perplexity")


def field_problem(record: dict, kinds: dict[str, str], required: tuple[str, ...]) -> str | None:
    """What is wrong with a run file's `record` in words: a `required` field missing, or a field that is not of its
    kind (`kinds`: field -> a kind of KINDS); None when nothing is."""
    if missing := [name for name in required if name not in record]:
        return f"no {missing[0]!r} field"
    for name, kind in kinds.items():
        if name in record and not KINDS[kind](record[name]):
            return f"{name!r} is {json_kind(record[name])}, not {kind}"
    return None


def json_kind(value) -> str:
    """A JSON value's kind in words, with the value where it is short: 'a string ("12")', 'a list', 'null'."""
    kind = {bool: "a boolean", str: "a string", list: "a list", dict: "an object", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)
    shown = json.dumps(value)
    return f"{kind} ({shown})" if value is not None and len(shown) <= 30 and not isinstance(value, list | dict) \
        else kind


# the run's record of its data (DATA_FILE): the text it read and the tokenizer it split it with, by content
# (eval_overlap: eval text that is training text, scored as --allow-eval-overlap allowed: corpus.EVAL_IS_TRAIN ...)
DATA_FIELDS = {"corpus": TEXT, "fingerprint": TEXT, "vocab_size": INTEGER, "tokenizer": TEXT, "eval_overlap": TEXT}
DATA_REQUIRED = ("fingerprint",)  # runs older than the tokenizer's fingerprint lack it: their tokenizer is not checked


def recorded_data(file: Path) -> dict | None:
    """The run's record of its data (None: no such file, a run older than it); one line naming the file and the
    field when it is not what convattn writes."""
    def damaged(problem: str) -> UsageError:
        return UsageError(f"{file} is damaged or not written by convattn ({problem}); restore it, or start a new run "
                          f"in another {option('output_dir')}")

    try:
        saved = read_json(file)
    except (ValueError, UnicodeDecodeError) as err:
        raise damaged(f"not JSON: {str(err)[:80]}") from None
    if saved is None:
        return None
    if not isinstance(saved, dict):
        raise damaged(f"{json_kind(saved)}, not the run's data record")
    if problem := field_problem(saved, DATA_FIELDS, DATA_REQUIRED):
        raise damaged(problem)
    return saved


def check_same_data(out: Path, corpus: str, fingerprint: str, tokenizer: str, tokenizer_source: str) -> None:
    """--resume reads the text the run started with and splits it with the same tokenizer, both compared by content
    with what DATA_FILE recorded (runs older than that file are not checked, nor the tokenizer of runs older than
    its fingerprint)."""
    saved = recorded_data(out / DATA_FILE)
    if saved is None:
        return
    if saved["fingerprint"] != fingerprint:
        raise UsageError(f"{option('resume')}: the text read now ({corpus}) is not the text the run in {out} started "
                         f"with ({saved.get('corpus')}); restore that text, or start a new run in another "
                         f"{option('output_dir')}")
    if saved.get("tokenizer", tokenizer) != tokenizer:
        raise UsageError(f"{option('resume')}: the tokenizer read now ({tokenizer_source}) splits text differently "
                         f"from the one the run in {out} started with (another tokenizer, or its files changed); "
                         f"restore that tokenizer, or start a new run in another {option('output_dir')}")


def written_by_run(entry: Path) -> bool:
    """Whether a file or folder in a run folder is one a pretraining run writes (a user's notes are not)."""
    name = entry.name
    if name == CARD_FILE:
        return is_model_card(entry)
    return name in RUN_ENTRIES or is_code_or_temp(name)


def written_inside_run(entry: Path, out: Path) -> bool:
    """`written_by_run` at any depth: inside plots/ only plot's figures, inside tensorboard/ only event files,
    inside checkpoints/ only checkpoint folders, inside those and discriminator/ only a model's files (a user's
    notes anywhere are not the run's)."""
    parts, name = entry.relative_to(out).parts, entry.name
    if len(parts) == 1:
        return written_by_run(entry)
    top = parts[0]
    if top in (REPLACED, PARTIAL):
        return True
    if top == PLOTS_DIR:
        return len(parts) == 2 and written_by_plot(entry)
    if top in (GLUE_DIR, SQUAD_DIR):  # what that job writes in its own folder
        from convattn.runs.finetune import written_inside_job

        return written_inside_job(top)(entry, out / top)
    if top == TENSORBOARD:
        return len(parts) == 2 and entry.is_file() and name.startswith("events.out.tfevents.")
    if top == CHECKPOINTS and len(parts) == 2:
        return entry.is_dir() and CHECKPOINT_NAME.fullmatch(name) is not None
    in_model = len(parts) == 3 if top == CHECKPOINTS else len(parts) == 2 and top in (DISCRIMINATOR, FINAL_TMP)
    return in_model and entry.is_file() and (name in MODEL_FILES or name in TRAINER_STATE_FILES or
                                             RNG_STATE.fullmatch(name) is not None or is_code_or_temp(name))


def foreign_files(out: Path) -> list[str]:
    """What `out` holds that a pretraining run does not write, at any depth, relative to `out` (a folder is named
    with a trailing /, not what it holds)."""
    return foreign_entries(out, written_inside_run)


def is_model_card(path: Path) -> bool:
    """The README.md convattn writes (Hub metadata naming convattn), not one the user wrote."""
    if not path.is_file():
        return False
    text = path.read_text(errors="replace")
    metadata = text.split("---", 2)[1] if text.startswith("---") and text.count("---") >= 2 else ""
    return "- convattn" in metadata


# what --overwrite moves aside and gives back (convattn.runs.replace)
PRETRAIN = JobLayout("pretrain", OPTIONS_FILE, written_by_run, has_saved, "its first checkpoint", written_inside_run)


def remove_run_files(out: Path) -> None:
    """Remove what a run wrote into `out` (`check_output_dir` made sure nothing else is there), but the lock and
    an old run kept aside."""
    PRETRAIN.remove_written(out)
