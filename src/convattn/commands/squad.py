"""`convattn squad`: fine-tune and evaluate a checkpoint on SQuAD v1.1 or v2.0 with ELECTRA's protocol."""

from __future__ import annotations

import argparse
import os

from convattn.commands.arguments import add_fine_tune_arguments, add_verbose_argument, user_path
from convattn.commands.fine_tune_flags import fine_tune_overrides, model_output_dir
from convattn.commands.training_process import prepare_training_process
from convattn.errors import UsageError
from convattn.runs.finetune import SQUAD_RESULTS
from convattn.training.finetune.recipes import fine_tune_recipe_names

EXAMPLES = """\
examples:
  # the ConvBERT paper's protocol (ELECTRA's fine-tuning), SQuAD v1.1 from the HF hub, 3 seeds
  convattn squad --model runs/convbert-small --version 1.1

  # SQuAD 2.0 from local files in the official JSON layout
  convattn squad --model runs/convbert-small --version 2.0 --train-file train-v2.0.json --dev-file dev-v2.0.json

  # a quick CPU check: 2000 training questions, 300 steps, 256-token windows, one seed
  convattn squad --model runs/tiny --version 1.1 --seeds 1 --max-steps 300 --max-train-samples 2000 \\
      --max-length 256

outputs (OUTPUT_DIR): squad_results.json, squad_results.md (EM / F1 mean ± SEM over seeds; v2.0 also HasAns /
NoAns and the dev-chosen no-answer threshold), models/squad<version>/ (the best-dev seed's fine-tuned model, see
--save-models), runs/squad<version>/seed<k>/ (run.json, predictions.json,
nbest_predictions.json, null_odds.json for v2.0, log.json). Finished seeds are skipped when the command is run
again, so an interrupted run resumes where it stopped.
"""

NAME = "squad"
HELP = "fine-tune and evaluate on SQuAD v1.1 / v2.0 (official EM and F1, ConvBERT paper Table 4)"
DESCRIPTION = (
    "Fine-tune a convattn (or any HF encoder with a fast tokenizer) checkpoint on SQuAD over several seeds: "
    "sliding windows over long contexts, the n-best span search, the official evaluation's exact match and F1, "
    "mean ± standard error over seeds."
)
SPAN_FLAGS = ("doc_stride", "max_query_length", "n_best", "max_answer_length")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_argument_group("what to run")
    what.add_argument("--model", required=True, type=os.path.expanduser,
                     help="checkpoint directory with model and tokenizer (convattn or HF), or an HF hub model id")
    what.add_argument("--version", required=True, choices=("1.1", "2.0"), help="SQuAD version")
    what.add_argument("--train-file", type=user_path, default=None,
                     help="training questions in the official SQuAD JSON layout (default: rajpurkar/squad or "
                          "rajpurkar/squad_v2 from the HF hub)")
    what.add_argument("--dev-file", type=user_path, default=None,
                     help="dev questions in the official SQuAD JSON layout (default: the hub's validation split)")
    what.add_argument("--output-dir", type=user_path, default=None,
                     help="where runs and results go (default: squad/<model folder name>-<weights fingerprint>)")
    what.add_argument("--recipe", choices=fine_tune_recipe_names("squad"), default="convbert",
                     help="hyperparameters of a paper (see configs/recipes/squad/*.yaml)")
    what.add_argument("--seeds", type=int, default=None,
                     help="fine-tuning runs, seeds 0..N-1 (default: the recipe's, 3 for convbert)")

    add_verbose_argument(what)
    hyper = add_fine_tune_arguments(parser)
    hyper.add_argument("--doc-stride", type=int, default=None, help="window starts advance by this many tokens")
    hyper.add_argument("--max-query-length", type=int, default=None, help="questions are cut to this many tokens")
    hyper.add_argument("--n-best", type=int, default=None, help="start and end candidates per window")
    hyper.add_argument("--max-answer-length", type=int, default=None, help="longest answer, in tokens")
    hyper.add_argument("--head", choices=("span", "joint"), default=None,
                       help="joint: ELECTRA's head (start, end given the start with beam 20, answerability; the "
                            "recipe's); span: BERT's start/end head. Models other than convattn always use their own")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from convattn.training.squad import run_squad

    if args.seeds is not None and args.seeds <= 0:
        raise UsageError(f"--seeds must be positive, got {args.seeds}")
    if (args.train_file is None) != (args.dev_file is None):
        raise UsageError("give both --train-file and --dev-file (local files), or neither (the HF hub)")
    output_dir = args.output_dir or model_output_dir("squad", args.model)
    prepare_training_process()  # a kill stops like Ctrl-C: an --overwrite gives the old results back at once
    results = run_squad(args.model, args.version, output_dir, train_file=args.train_file, dev_file=args.dev_file,
                        recipe=args.recipe, seeds=args.seeds,
                        overrides={**fine_tune_overrides(args, SPAN_FLAGS), "head": args.head},
                        save_models=args.save_models, overwrite=args.overwrite)
    print((output_dir / "squad_results.md").read_text())
    print(f"results: {output_dir / SQUAD_RESULTS}")
    if results.get("model_dir"):
        print(f"model:   {results['model_dir']}/ (the best dev seed; AutoModelForQuestionAnswering loads it)")
    return 0 if results["seeds"] else 1
