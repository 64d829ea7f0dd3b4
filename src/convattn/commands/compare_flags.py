"""`convattn compare`'s and `plot kernel-size`'s flags read back as a `CompareOptions`: the pretraining runs'
options and the follow-up fine-tuning jobs they ask for (--glue, --squad), each checked (one UsageError naming the
flag)."""

from __future__ import annotations

import argparse
from pathlib import Path

from convattn.commands.arguments import compile_mode_asked
from convattn.commands.pretrain_flags import config_overrides, data_options, recipe_overrides
from convattn.errors import UsageError


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
    from convattn.training.ranges import check_range

    dependent = {"--glue-data-dir": args.glue_data_dir, "--glue-max-steps": args.glue_max_steps,
                 "--glue-max-train-samples": args.glue_max_train_samples}
    counts = {"--glue-seeds": args.glue_seeds, "--glue-max-steps": args.glue_max_steps,
              "--glue-max-train-samples": args.glue_max_train_samples}
    if not follow_up_job_asked(args.glue, "--glue TASKS", dependent, counts):
        return None
    check_range("max_steps", args.glue_max_steps, "--glue-max-steps")
    overrides = {"max_steps": args.glue_max_steps, "max_train_samples": args.glue_max_train_samples}
    return GlueOptions(parse_task_list(args.glue), args.glue_data_dir, args.glue_recipe, args.glue_seeds, overrides)


def squad_request(args: argparse.Namespace):
    from convattn.training.compare.options import SquadOptions
    from convattn.training.ranges import check_range

    dependent = {"--squad-train-file": args.squad_train_file, "--squad-dev-file": args.squad_dev_file,
                 "--squad-max-steps": args.squad_max_steps, "--squad-max-length": args.squad_max_length}
    counts = {"--squad-seeds": args.squad_seeds, "--squad-max-steps": args.squad_max_steps,
              "--squad-max-length": args.squad_max_length}
    if args.squad and (args.squad_train_file is None) != (args.squad_dev_file is None):
        raise UsageError("give both --squad-train-file and --squad-dev-file (local files), or neither (the HF hub)")
    if not follow_up_job_asked(args.squad, "--squad VERSION", dependent, counts):
        return None
    check_range("max_steps", args.squad_max_steps, "--squad-max-steps")
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
        compile=compile_mode_asked(args), log_every=args.log_every, glue=glue_request(args), squad=squad_request(args),
    )
