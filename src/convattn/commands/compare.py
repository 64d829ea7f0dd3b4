"""`convattn compare`: pretrain a grid of models on one budget and report them side by side."""

from __future__ import annotations

import argparse
from pathlib import Path

from convattn.commands.arguments import add_run_arguments
from convattn.commands.compare_flags import compare_options
from convattn.commands.training_process import prepare_training_process
from convattn.errors import UsageError, option

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
  convattn compare --presets chang2021-small/none,chang2021-small/composite --squad 1.1 --squad-max-steps 1000
      ... with SQuAD v1.1 dev exact match and F1 of each final model (HF hub data, or --squad-train-file/-dev-file)
  convattn compare --grid malard-n512 --output-dir runs/malard --report-only
      rebuild the report from the runs already there, without training

Every run gets the same data, tokenizer, recipe, budget and seeds. OUTPUT_DIR holds report.md, report.html,
perplexity.png (eval perplexity vs step, one line per run), metrics.csv (run x seed x evaluation),
summary.csv (one row per run), tokenizer/ and runs/<run>/seed<k>/ (`convattn pretrain` outputs). Run the
same command again to continue: finished runs are reused and an interrupted one resumes from its checkpoint.
"""


NAME = "compare"
HELP = "pretrain several presets on one budget and seeds; report perplexity, speed, memory (and GLUE)"
DESCRIPTION = (
    "Pretrain a grid of presets on the same data, tokenizer, recipe, budget and seeds, then write "
    "one report: a table per run (parameters, tokens/s, training memory, final eval perplexity "
    "mean ± std over seeds, optional GLUE dev scores), eval perplexity vs step, and CSVs. "
    "Training options left unset take the recipe's value."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from convattn.training.compare.grids import grid_names
    from convattn.training.length_eval import MAX_BLOCKS

    what = parser.add_argument_group("what to compare (one of)")
    choice = what.add_mutually_exclusive_group(required=True)
    choice.add_argument("--grid", metavar="NAME", help=f"a shipped grid: {', '.join(grid_names())}")
    choice.add_argument("--presets", metavar="P1,P2,...", help="comma-separated presets (see `convattn presets`)")
    add_run_arguments(parser, default_output="runs/compare-GRID")
    parser.add_argument("--eval-lengths", metavar="N1,N2,...",
                        help="also score every finished run on --eval-file at these input lengths, e.g. 128,512,1024 "
                             "(length generalisation: lengths.md, lengths.csv, lengths.png; works with --report-only)")
    parser.add_argument("--eval-length-blocks", metavar="N|all",
                        help="the text --eval-lengths scores: the eval file's first N blocks of the longest length "
                             f"(default {MAX_BLOCKS}), or all of it; more text, less noise from the masks' draw")
    parser.set_defaults(func=run)


def parse_presets(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def run(args: argparse.Namespace) -> int:
    from convattn.training.compare.grids import grid_from_presets, load_grid
    from convattn.training.compare.job import compare_and_report
    from convattn.training.compare.lengths import LengthRequest, eval_files, parse_blocks, parse_lengths
    from convattn.training.length_eval import MAX_BLOCKS

    grid = load_grid(args.grid) if args.grid else grid_from_presets(parse_presets(args.presets))
    options = compare_options(args, grid, Path("runs") / f"compare-{grid.name}")
    eval_lengths = None
    if args.eval_lengths:
        blocks = MAX_BLOCKS if args.eval_length_blocks is None else parse_blocks(args.eval_length_blocks)
        eval_lengths = LengthRequest(parse_lengths(args.eval_lengths), blocks)
        eval_files(options)  # refuse before any training when there is no eval text to score
    elif args.eval_length_blocks is not None:
        raise UsageError(f"{option('eval_length_blocks')} sets the text {option('eval_lengths')} scores; give "
                         f"{option('eval_lengths')} too, or leave it out")
    if not args.report_only:
        prepare_training_process()
    return compare_and_report(options, args.report_only, eval_lengths)
