"""`convattn compare`: pretrain a grid of models on one budget and report them side by side."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from convattn.commands.pretrain import (
    HelpFormatter,
    add_architecture_arguments,
    add_data_arguments,
    add_schedule_arguments,
    add_training_arguments,
    config_overrides,
    data_options,
    prepare_training_process,
    recipe_overrides,
)
from convattn.errors import UsageError

EXAMPLES = """\
examples:
  convattn compare --presets chang2021-small/absolute,chang2021-small/composite --layers 2 --hidden 128 \\
      --max-steps 300 --seeds 2
      two presets, scaled down, on the embedded default corpus
  convattn compare --grid chang2021-small --train-file wiki/ books/ --eval-file wiki.valid.raw \\
      --layers 2 --hidden 128 --heads 2 --intermediate 512 --vocab-size 8000 --batch-size 32 --max-steps 1000
      the composite paper's 14 BERT-small rows, scaled down, 3 seeds each
  convattn compare --grid convbert --glue sst2,mrpc --glue-data-dir glue_data --glue-max-steps 300
      BERT vs ConvBERT, with GLUE dev scores of each final model
  convattn compare --grid malard-n512 --output-dir runs/malard --report-only
      rebuild the report from the runs already there, without training

Every run gets the same data, tokenizer, recipe, budget and seeds. OUTPUT_DIR holds report.md, report.html,
perplexity.png (eval perplexity vs step, one line per run), metrics.csv (run x seed x evaluation),
summary.csv (one row per run), tokenizer/ and runs/<run>/seed<k>/ (`convattn pretrain` outputs). Run the
same command again to continue: finished runs are reused and an interrupted one resumes from its checkpoint.
"""


def register(subparsers) -> None:
    from convattn.training.grids import grid_names

    parser = subparsers.add_parser(
        "compare",
        help="pretrain several presets on one budget and seeds; report perplexity, speed, memory (and GLUE)",
        description="Pretrain a grid of presets on the same data, tokenizer, recipe, budget and seeds, then write "
                    "one report: a table per run (parameters, tokens/s, training memory, final eval perplexity "
                    "mean ± std over seeds, optional GLUE dev scores), eval perplexity vs step, and CSVs. "
                    "Training options left unset take the recipe's value.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    what = parser.add_argument_group("what to compare (one of)")
    choice = what.add_mutually_exclusive_group(required=True)
    choice.add_argument("--grid", metavar="NAME", help=f"a shipped grid: {', '.join(grid_names())}")
    choice.add_argument("--presets", metavar="P1,P2,...", help="comma-separated presets (see `convattn presets`)")
    add_run_arguments(parser, default_output="runs/compare-GRID")
    parser.set_defaults(func=run)


def add_run_arguments(parser: argparse.ArgumentParser, default_output: str) -> None:
    """Everything but the choice of runs: shared by `convattn compare` and `convattn plot kernel-size`."""
    model = parser.add_argument_group("architecture overrides (applied to every run)")
    add_architecture_arguments(model)
    add_data_arguments(parser.add_argument_group("data (the same for every run; unset: the recipe's value)"),
                       recipe_defaults=False)
    training = parser.add_argument_group("training (the same for every run; unset: the recipe's value)")
    add_training_arguments(training, recipe_help="(default: the grid's, else the first preset's paper)", seed=False,
                           recipe_defaults=False)
    training.add_argument("--seeds", type=int, default=3, metavar="N",
                          help="pretraining seeds per run, 0..N-1 (initialisation, data order, masking)")

    glue = parser.add_argument_group("GLUE fine-tuning of each final model (optional; see `convattn glue`)")
    glue.add_argument("--glue", metavar="TASKS", help="comma-separated GLUE tasks, e.g. sst2,mrpc,cola")
    glue.add_argument("--glue-data-dir", type=Path, metavar="DIR",
                      help="glue_data directory in the GLUE TSV layout (default: nyu-mll/glue from the HF hub)")
    glue.add_argument("--glue-recipe", choices=("chang2021", "convbert"), default="chang2021",
                      help="fine-tuning hyperparameters")
    glue.add_argument("--glue-seeds", type=int, default=1, metavar="N", help="fine-tuning seeds per model")
    glue.add_argument("--glue-max-steps", type=int, metavar="N",
                      help="fine-tuning steps (default: the recipe's epochs)")
    glue.add_argument("--glue-max-train-samples", type=int, metavar="N",
                      help="fine-tune on a fixed random subset of this many examples")

    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", type=Path, help=f"where the runs and the report go (default: {default_output})")
    add_schedule_arguments(output, recipe_defaults=False)
    output.add_argument("--report-only", action="store_true",
                        help="rebuild the report from the runs in --output-dir without training (their settings "
                             "and seeds are read from the run directories)")


def glue_request(args: argparse.Namespace):
    from convattn.data.glue import parse_task_list
    from convattn.training.compare import GlueRequest

    glue_flags = {"--glue-data-dir": args.glue_data_dir, "--glue-max-steps": args.glue_max_steps,
                  "--glue-max-train-samples": args.glue_max_train_samples}
    given = [flag for flag, value in glue_flags.items() if value is not None]
    if not args.glue:
        if given:
            raise UsageError(f"{', '.join(given)} need(s) --glue TASKS")
        return None
    for flag, value in (("--glue-seeds", args.glue_seeds), ("--glue-max-steps", args.glue_max_steps),
                        ("--glue-max-train-samples", args.glue_max_train_samples)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value} must be at least 1")
    overrides = {"max_steps": args.glue_max_steps, "max_train_samples": args.glue_max_train_samples}
    return GlueRequest(parse_task_list(args.glue), args.glue_data_dir, args.glue_recipe, args.glue_seeds, overrides)


def compare_options(args: argparse.Namespace, grid, default_output: Path):
    """CompareOptions from the shared run arguments (`add_run_arguments`) and a grid."""
    from convattn.training.compare import CompareOptions

    return CompareOptions(
        grid=grid, output_dir=args.output_dir or default_output, data=data_options(args), seeds=args.seeds,
        recipe=args.recipe, model=config_overrides(args), training=recipe_overrides(args), precision=args.precision,
        log_every=args.log_every, glue=glue_request(args),
    )


def parse_presets(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def execute(options, report_only: bool) -> int:
    """Run (or only report) a comparison; prints the summary table. Returns the exit code."""
    from convattn.training.compare import run_compare
    from convattn.training.compare_report import Report, seeds_in_output, write_report
    from convattn.training.grids import check_runs

    interrupted = False
    if report_only:
        check_runs(options.grid.runs)
        options.seeds = seeds_in_output(options)
        if not options.seeds:
            raise UsageError(f"--report-only: {options.output_dir} has no runs of these models to report on; check "
                             "--output-dir and --grid/--presets")
    else:
        prepare_training_process()
        outcome = run_compare(options)
        interrupted = outcome.interrupted
        print(f"compare: {outcome.trained} run(s) trained, {outcome.reused} reused", file=sys.stderr)
    results = write_report(options)
    print("\n".join(Report(options, results, figure=None).summary_lines()))
    print(f"report: {options.output_dir / 'report.md'} (also report.html, perplexity.png, metrics.csv, summary.csv)")
    if interrupted:
        print("interrupted: run the same command again to continue (finished runs are reused)", file=sys.stderr)
        return 130
    return 0


def run(args: argparse.Namespace) -> int:
    from convattn.training.grids import grid_from_presets, load_grid

    grid = load_grid(args.grid) if args.grid else grid_from_presets(parse_presets(args.presets))
    options = compare_options(args, grid, Path("runs") / f"compare-{grid.name}")
    return execute(options, args.report_only)
