"""A pretraining run's flags read back as the library's options: config overrides (--layers, --set FIELD=VALUE),
recipe fields and data options. `convattn pretrain`, `compare` and `plot kernel-size` share them; each value is
checked where it is read (one UsageError naming the flag)."""

from __future__ import annotations

import argparse
import difflib
import os
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
                allow_eval_overlap=args.allow_eval_overlap,
                cache_dir=args.cache_dir or default_cache_dir())
