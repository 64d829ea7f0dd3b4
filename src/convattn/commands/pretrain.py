"""`convattn pretrain`: raw text to a trained encoder (the project's main job)."""

from __future__ import annotations

import argparse
import sys

from convattn.commands.arguments import (
    add_architecture_arguments,
    add_data_arguments,
    add_schedule_arguments,
    add_training_arguments,
    compile_mode_asked,
    user_path,
)
from convattn.commands.pretrain_flags import config_overrides, data_options, recipe_overrides
from convattn.commands.training_process import prepare_training_process

EXAMPLES = """\
examples:
  convattn pretrain
      the quick run: a small composite-attention model on the embedded default corpus (a few minutes on CPU)
  convattn pretrain --train-file corpus/ --eval-file valid.txt --max-steps 5000
      your own text (files, directories or globs), with the default recipe
  convattn pretrain --preset chang2021-small/composite --dataset --output-dir runs/small-composite
      the paper protocol (recipe chang2021-small) on WikiText-103 from the HuggingFace hub
  convattn pretrain --preset chang2021-small/absolute --layers 4 --hidden 128 --set relative_reach=4
      any preset, with architecture overrides
  convattn pretrain --output-dir runs/small-composite --resume
      continue an interrupted run (repeat its options; Ctrl-C keeps the last checkpoint)
  torchrun --nproc-per-node 2 -m convattn pretrain ...
      data-parallel over 2 processes: CPU (gloo) or GPUs
  accelerate launch --multi_gpu --num_processes 2 -m convattn pretrain ...
      the same with accelerate (without --multi_gpu it runs ONE process on a machine without GPUs)
"""


NAME = "pretrain"
HELP = "pretrain an encoder (MLM or ELECTRA) from raw text"
DESCRIPTION = (
    "Pretrain a convattn encoder from raw text: train (or load) a tokenizer, format and cache the "
    "corpus, train with a paper's recipe, evaluate perplexity on held-out text, and save a model "
    "that AutoModelForMaskedLM.from_pretrained loads. Options left unset take the recipe's value."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("--preset", help="model preset (see `convattn presets`; default: the recipe's)")
    add_architecture_arguments(model)
    add_data_arguments(parser.add_argument_group("data"))
    add_training_arguments(parser.add_argument_group("training"), recipe_help="(default: the preset's paper)")

    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", type=user_path, help="where the run goes (default: runs/pretrain-RECIPE)")
    add_schedule_arguments(output)
    output.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    output.add_argument("--allow-schedule-change", action="store_true",
                        help="with --resume: accept a new --max-steps (the learning-rate schedule changes with it)")
    output.add_argument("--overwrite", action="store_true",
                        help="replace an existing --output-dir that holds a convattn run (never anything else)")
    parser.set_defaults(func=run)


def options_from_args(args: argparse.Namespace):
    from convattn.training.pretrain.resolve import resolve_options

    return resolve_options(
        output_dir=args.output_dir, preset=args.preset, recipe=args.recipe, model=config_overrides(args),
        training=recipe_overrides(args), data={**data_options(args), "cache_dir": args.cache_dir},
        precision=args.precision, compile=compile_mode_asked(args), log_every=args.log_every, resume=args.resume,
        overwrite=args.overwrite, allow_schedule_change=args.allow_schedule_change,
    )


def run(args: argparse.Namespace) -> int:
    from convattn.console import main_process
    from convattn.training.pretrain import pretrain

    options = options_from_args(args)
    prepare_training_process()
    summary = pretrain(options)
    if main_process():
        print("\n".join(summary.lines()), file=sys.stderr if summary.interrupted else sys.stdout)
    return 130 if summary.interrupted else 0

