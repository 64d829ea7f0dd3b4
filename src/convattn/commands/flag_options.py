"""What the parsed flags ask for, as the library's options: config and recipe overrides, data options, GLUE and
SQuAD requests, a comparison's options; each value checked where it is read (one UsageError naming the flag).
Also the process set-up of every command that trains."""

from __future__ import annotations

import argparse
import difflib
import os
import signal
import threading
from pathlib import Path

import yaml

from convattn.commands.arguments import ARCHITECTURE_FLAGS, HUB_DEFAULT, RECIPE_FLAGS
from convattn.errors import UsageError


def config_overrides(args: argparse.Namespace) -> dict:
    from convattn.config import ConvAttnConfig

    overrides = {field: getattr(args, flag) for flag, field in ARCHITECTURE_FLAGS.items()
                 if getattr(args, flag) is not None}
    known = [name for name in ConvAttnConfig.__annotations__ if not name.startswith("_")]
    for item in args.set:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--set {item!r} must look like FIELD=VALUE, e.g. --set hidden_dropout_prob=0.0")
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "run `convattn presets` to see config fields"
            raise UsageError(f"--set {name}: not a config field; {hint}")
        overrides[name] = checked_value(name, yaml_value(item, value), getattr(ConvAttnConfig, name, None))
    return overrides


def yaml_value(item: str, value: str):
    """The value of --set FIELD=VALUE, read as YAML."""
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or type(err).__name__
        raise UsageError(f"--set {item!r}: the value is not valid YAML ({problem}); e.g. --set "
                         "relative_terms=[fixed,dynamic_query] or --set hidden_dropout_prob=0.1") from None


def checked_value(name: str, value, default):
    """--set values must have the field's type (judged by its default), so a typo fails now, not in the model."""
    kinds = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}
    allowed = kinds.get(type(default))
    if allowed and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
        raise UsageError(f"--set {name}={value!r}: expected {type(default).__name__} (like the default {default!r})")
    return value


def recipe_overrides(args: argparse.Namespace) -> dict:
    """The recipe fields given on the command line (RECIPE_FLAGS that the parser has and that are set)."""
    return {name: getattr(args, name) for name in RECIPE_FLAGS if getattr(args, name, None) is not None}


def data_options(args: argparse.Namespace) -> dict:
    """The `PretrainOptions` fields of the data group (`add_data_arguments`)."""
    from convattn.training.pretrain import default_cache_dir

    dataset_config = args.dataset_config
    if dataset_config is not None and not args.dataset:
        raise UsageError(f"--dataset-config {dataset_config} needs --dataset (a hub dataset); leave it out with "
                         "--train-file or the embedded default")
    if args.dataset == HUB_DEFAULT[0] and dataset_config is None:
        dataset_config = HUB_DEFAULT[1]
    # local paths as absolute ones: the run records them, and a --resume from another directory reads the same text
    tokenizer = os.path.abspath(args.tokenizer) if args.tokenizer and Path(args.tokenizer).exists() else args.tokenizer
    return dict(dataset=args.dataset, dataset_config=dataset_config,
                train_files=[os.path.abspath(p) for p in args.train_file],
                eval_files=[os.path.abspath(p) for p in args.eval_file], tokenizer=tokenizer,
                cache_dir=args.cache_dir or default_cache_dir())


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt


def prepare_training_process() -> None:
    """Make a kill stop like Ctrl-C, so checkpoints stay intact."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop_on_sigterm)


FINE_TUNE_FIELDS = {"lr": "learning_rate", "batch_size": "batch_size", "epochs": "epochs", "max_steps": "max_steps",
                    "warmup_ratio": "warmup_ratio", "weight_decay": "weight_decay", "layer_decay": "layer_decay",
                    "max_length": "max_length", "max_train_samples": "max_train_samples"}


POSITIVE_FLAGS = ("max_steps", "batch_size", "max_train_samples")


MAX_EPOCHS = 10_000
MAX_STEPS = 10**9  # years of training at any speed


def fine_tune_overrides(args: argparse.Namespace, extra: tuple[str, ...] = ()) -> dict:
    """The settings fields given on the command line (None: the recipe's), each checked against its range (one
    UsageError naming the flag and the allowed values). `extra`: more positive integer flags (dest) that map to
    the field of the same name. --max-length is checked against the model once it is loaded."""
    import math

    ranges = {  # dest -> (test, the allowed values in words)
        "lr": (lambda v: 0 < v < math.inf, "a finite number > 0"),
        "weight_decay": (lambda v: 0 <= v < math.inf, "a finite number >= 0"),
        "layer_decay": (lambda v: 0 < v <= 1, "a number in (0, 1] (1: no decay)"),
        "warmup_ratio": (lambda v: 0 <= v < 1, "a fraction in [0, 1)"),
        "epochs": (lambda v: 0 < v <= MAX_EPOCHS, f"a number in (0, {MAX_EPOCHS:,}]"),
        "max_length": (lambda v: v >= 1, "an integer >= 1 (tokens per input)"),
        **{name: (lambda v: v >= 1, "an integer >= 1") for name in (*POSITIVE_FLAGS, *extra)},
        "max_steps": (lambda v: 1 <= v <= MAX_STEPS, f"an integer from 1 to {MAX_STEPS:,}"),
    }
    for name, (allowed, words) in ranges.items():
        value = getattr(args, name, None)
        if value is not None and not allowed(value):  # NaN fails every comparison
            raise UsageError(f"--{name.replace('_', '-')} {value} must be {words}")
    fields = {**FINE_TUNE_FIELDS, **{name: name for name in extra}}
    return {field: getattr(args, flag) for flag, field in fields.items()}


def model_output_dir(command: str, model: str) -> Path:
    """<command>/<model folder name>-<fingerprint> for a saved model (two models with one folder name never share
    results), <command>/<name> for a hub id."""
    from convattn.files import model_identity

    if not Path(model).is_dir():
        return Path(command) / Path(model).name
    return Path(command) / f"{Path(model).name}-{model_identity(model)[:8]}"


def check_step_limit(flag: str, steps: int | None) -> None:
    if steps is not None and steps > MAX_STEPS:
        raise UsageError(f"{flag} {steps} must be an integer from 1 to {MAX_STEPS:,}")


def follow_up_job_asked(job, job_flag: str, dependent: dict[str, object], counts: dict[str, int | None]) -> bool:
    """Whether compare's follow-up job (--glue, --squad) was asked for: its own flags without it are refused, and
    its counts must be at least 1."""
    given = [flag for flag, value in dependent.items() if value is not None]
    if not job:
        if given:
            raise UsageError(f"{', '.join(given)} need(s) {job_flag}")
        return False
    for flag, value in counts.items():
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value} must be at least 1")
    return True


def glue_request(args: argparse.Namespace):
    from convattn.data.glue import parse_task_list
    from convattn.training.compare.options import GlueOptions

    dependent = {"--glue-data-dir": args.glue_data_dir, "--glue-max-steps": args.glue_max_steps,
                 "--glue-max-train-samples": args.glue_max_train_samples}
    counts = {"--glue-seeds": args.glue_seeds, "--glue-max-steps": args.glue_max_steps,
              "--glue-max-train-samples": args.glue_max_train_samples}
    if not follow_up_job_asked(args.glue, "--glue TASKS", dependent, counts):
        return None
    check_step_limit("--glue-max-steps", args.glue_max_steps)
    overrides = {"max_steps": args.glue_max_steps, "max_train_samples": args.glue_max_train_samples}
    return GlueOptions(parse_task_list(args.glue), args.glue_data_dir, args.glue_recipe, args.glue_seeds, overrides)


def squad_request(args: argparse.Namespace):
    from convattn.training.compare.options import SquadOptions

    dependent = {"--squad-train-file": args.squad_train_file, "--squad-dev-file": args.squad_dev_file,
                 "--squad-max-steps": args.squad_max_steps, "--squad-max-length": args.squad_max_length}
    counts = {"--squad-seeds": args.squad_seeds, "--squad-max-steps": args.squad_max_steps,
              "--squad-max-length": args.squad_max_length}
    if args.squad and (args.squad_train_file is None) != (args.squad_dev_file is None):
        raise UsageError("give both --squad-train-file and --squad-dev-file (local files), or neither (the HF hub)")
    if not follow_up_job_asked(args.squad, "--squad VERSION", dependent, counts):
        return None
    check_step_limit("--squad-max-steps", args.squad_max_steps)
    overrides = {"max_steps": args.squad_max_steps, "max_length": args.squad_max_length}
    return SquadOptions(args.squad, args.squad_train_file, args.squad_dev_file, args.squad_seeds, overrides)


def compare_options(args: argparse.Namespace, grid, default_output: Path):
    """CompareOptions from the shared run arguments (`add_run_arguments`) and a grid."""
    from convattn.training.compare.options import CompareOptions
    from convattn.training.pretrain.resolve import check_vocabulary_source

    data, training = data_options(args), recipe_overrides(args)
    check_vocabulary_source(training, data["tokenizer"])
    return CompareOptions(
        grid=grid, output_dir=args.output_dir or default_output, data=data, seeds=args.seeds,
        recipe=args.recipe, model=config_overrides(args), training=training, precision=args.precision,
        compile=args.compile, log_every=args.log_every, glue=glue_request(args), squad=squad_request(args),
    )
