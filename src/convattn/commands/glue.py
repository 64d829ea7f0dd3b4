"""`convattn glue`: fine-tune and evaluate a checkpoint on GLUE with the papers' protocol."""

from __future__ import annotations

import argparse
import os

from convattn.commands.arguments import add_fine_tune_arguments, add_verbose_argument, user_path
from convattn.commands.fine_tune_flags import fine_tune_overrides, model_output_dir
from convattn.commands.training_process import prepare_training_process
from convattn.errors import UsageError
from convattn.runs.finetune import GLUE_RESULTS
from convattn.training.finetune.recipes import fine_tune_recipe_names

EXAMPLES = """\
examples:
  # the composite-attention paper's protocol on every task (10 seeds, RTE/STS-B/MRPC from MNLI)
  convattn glue --model runs/small-composite --task all --data-dir glue_data --from-mnli

  # ConvBERT's recipe (layer-wise lr decay 0.8, wd 0.01), 3 seeds, HF hub data
  convattn glue --model runs/convbert-small --task cola,sst2,mrpc --recipe convbert --seeds 3

  # a quick CPU check: 2000 training examples, 300 steps, one seed
  convattn glue --model runs/tiny --task sst2 --data-dir glue_data --seeds 1 --max-steps 300 \\
      --max-train-samples 2000

  # an HF baseline, with per-task learning rates
  convattn glue --model google/electra-small-discriminator --task rte,qnli --lr 1e-4 --task-lr rte=3e-5

outputs (OUTPUT_DIR): glue_results.json, glue_results.md (Table 6 layout), submission/ (best-dev seed's test
predictions in the GLUE submission format), models/<task>/ (the best-dev seed's fine-tuned model, see
--save-models), runs/<task>/seed<k>/ (run.json, log.json, predictions/).
Finished runs are skipped when the command is run again, so an interrupted run resumes where it stopped.
"""


NAME = "glue"
HELP = "fine-tune and evaluate on GLUE (papers' protocol: seeds, mean ± SEM, Table 6 layout)"
DESCRIPTION = (
    "Fine-tune a convattn (or any HF encoder) checkpoint on GLUE tasks over several seeds and "
    "report dev mean ± standard error, the best-dev seed, the GLUE score and test predictions."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_argument_group("what to run")
    what.add_argument("--model", required=True, type=os.path.expanduser,
                     help="checkpoint directory with model and tokenizer (convattn or HF), or an HF hub model id")
    what.add_argument("--task", required=True,
                     help="comma-separated tasks (cola sst2 mrpc stsb qqp mnli qnli rte wnli ax) or 'all'; "
                          "ax is predicted with the MNLI model")
    what.add_argument("--data-dir", type=user_path, default=None,
                     help="glue_data directory in the standard GLUE TSV layout (default: nyu-mll/glue from the HF hub)")
    what.add_argument("--output-dir", type=user_path, default=None,
                     help="where runs and results go (default: glue/<model folder name>-<weights fingerprint>)")
    what.add_argument("--recipe", choices=fine_tune_recipe_names("glue"), default="chang2021",
                     help="hyperparameters of a paper (see configs/recipes/glue/*.yaml)")
    what.add_argument("--seeds", type=int, default=None,
                     help="fine-tuning runs per task, seeds 0..N-1 (default: the recipe's, 10 for chang2021, "
                          "9 for convbert)")
    what.add_argument("--from-mnli", action="store_true",
                     help="start RTE, STS-B and MRPC from the same seed's MNLI-tuned encoder, as both papers did")

    add_verbose_argument(what)
    hyper = add_fine_tune_arguments(parser)
    hyper.add_argument("--task-lr", action="append", default=[], metavar="TASK=LR",
                       help="per-task learning rate, e.g. qnli=1e-4 (repeatable or comma-separated); wins over --lr")
    parser.set_defaults(func=run)


def parse_task_lr(items: list[str]) -> dict[str, float]:
    from convattn.training.ranges import RANGES

    task_lr = {}
    for item in (part for entry in items for part in entry.split(",") if part.strip()):
        name, _, value = item.partition("=")
        try:
            lr = float(value)
        except ValueError:
            raise UsageError(f"--task-lr expects TASK=LR, e.g. qnli=1e-4; got {item!r}") from None
        if not RANGES["learning_rate"].allows(lr):
            raise UsageError(f"--task-lr {item}: the learning rate must be {RANGES['learning_rate'].said}")
        task_lr[name.strip().lower()] = lr
    return task_lr


def run(args: argparse.Namespace) -> int:
    from convattn.data.glue import parse_task_list
    from convattn.training.glue import run_glue

    tasks = parse_task_list(args.task)
    if args.seeds is not None and args.seeds <= 0:
        raise UsageError(f"--seeds {args.seeds} must be an integer >= 1")
    task_lr = parse_task_lr(args.task_lr)
    overrides = fine_tune_overrides(args)
    output_dir = args.output_dir or model_output_dir("glue", args.model)
    prepare_training_process()  # a kill stops like Ctrl-C: an --overwrite gives the old results back at once
    results = run_glue(args.model, tasks, output_dir, data_dir=args.data_dir, recipe=args.recipe, seeds=args.seeds,
                       overrides=overrides, task_lr=task_lr, from_mnli=args.from_mnli, save_models=args.save_models,
                       overwrite=args.overwrite)
    print((output_dir / "glue_results.md").read_text())
    glue = results["glue"]
    if "mean" in glue:
        print(f"GLUE score{'' if glue['complete'] else ' (partial)'}: {glue['mean']:.1f}")
    print(f"results: {output_dir / GLUE_RESULTS}")
    if results["models"]:
        print(f"models:  {output_dir / 'models'}/ ({', '.join(results['models'])}: the best dev seed of each, ready "
              "for pipelines, `convattn push` and `convattn export`)")
    return 0
