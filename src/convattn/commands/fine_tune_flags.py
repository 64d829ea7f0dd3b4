"""What `convattn glue` and `convattn squad` read from their flags: the settings fields given, each checked against
its range in the library's table (`training/ranges.py`), how the runs execute (precision, torch.compile), and the
folder a model's results go to by default."""

from __future__ import annotations

import argparse
from pathlib import Path

# the settings fields the shared fine-tuning flags set (`add_fine_tune_arguments`: each flag's dest is its field)
FINE_TUNE_FIELDS = ("learning_rate", "batch_size", "epochs", "max_steps", "warmup_ratio", "weight_decay",
                    "layer_decay", "max_length", "max_train_samples")


def fine_tune_overrides(args: argparse.Namespace, extra: tuple[str, ...] = ()) -> dict:
    """The settings fields of the flags (None: not given, the recipe's), each checked against its range (one
    UsageError naming the flag and the allowed values). `extra`: the command's own flags of settings fields.
    --max-length is checked against the model once it is loaded."""
    from convattn.commands.arguments import compile_mode_asked
    from convattn.training.ranges import check_ranges

    overrides = {field: getattr(args, field) for field in (*FINE_TUNE_FIELDS, *extra)}
    check_ranges(overrides)
    return overrides | {"precision": args.precision, "compile": compile_mode_asked(args)}


def model_output_dir(command: str, model: str) -> Path:
    """<command>/<model folder name>-<fingerprint> for a saved model (two models with one folder name never share
    results), <command>/<name> for a hub id."""
    from convattn.files import model_identity

    if not Path(model).is_dir():
        return Path(command) / Path(model).name
    return Path(command) / f"{Path(model).name}-{model_identity(model)[:8]}"
