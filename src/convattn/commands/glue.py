"""`convattn glue`: fine-tune and evaluate a checkpoint on GLUE with the papers' protocol."""

from __future__ import annotations

import argparse
from pathlib import Path

from convattn.errors import UsageError
from convattn.training.recipes import glue_recipe_names

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
predictions in the GLUE submission format), runs/<task>/seed<k>/ (run.json, log.json, predictions/).
Finished runs are skipped when the command is run again, so an interrupted run resumes where it stopped.
"""


NAME = "glue"
HELP = "fine-tune and evaluate on GLUE (papers' protocol: seeds, mean ± SEM, Table 6 layout)"
DESCRIPTION = (
    "Fine-tune a convattn (or any HF encoder) checkpoint on GLUE tasks over several seeds and "
    "report dev mean ± standard error, the best-dev seed, the GLUE score and test predictions."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("what to run")
    run.add_argument("--model", required=True,
                     help="checkpoint directory with model and tokenizer (convattn or HF), or an HF hub model id")
    run.add_argument("--task", required=True,
                     help="comma-separated tasks (cola sst2 mrpc stsb qqp mnli qnli rte wnli ax) or 'all'; "
                          "ax is predicted with the MNLI model")
    run.add_argument("--data-dir", type=Path, default=None,
                     help="glue_data directory in the standard GLUE TSV layout (default: nyu-mll/glue from the HF hub)")
    run.add_argument("--output-dir", type=Path, default=None,
                     help="where runs and results go (default: glue/<model folder name>-<weights fingerprint>)")
    run.add_argument("--recipe", choices=glue_recipe_names(), default="chang2021",
                     help="hyperparameters of a paper (see configs/recipes/glue/*.yaml)")
    run.add_argument("--seeds", type=int, default=None,
                     help="fine-tuning runs per task, seeds 0..N-1 (default: the recipe's, 10 for chang2021, "
                          "9 for convbert)")
    run.add_argument("--from-mnli", action="store_true",
                     help="start RTE, STS-B and MRPC from the same seed's MNLI-tuned encoder, as both papers did")

    hyper = parser.add_argument_group("hyperparameter overrides (default: the recipe's, per task)")
    length = hyper.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=float, default=None, help="training epochs for every task")
    length.add_argument("--max-steps", type=int, default=None, help="training steps for every task (instead of epochs)")
    hyper.add_argument("--lr", type=float, default=None, help="peak learning rate for every task")
    hyper.add_argument("--task-lr", action="append", default=[], metavar="TASK=LR",
                       help="per-task learning rate, e.g. qnli=1e-4 (repeatable or comma-separated); wins over --lr")
    hyper.add_argument("--batch-size", type=int, default=None, help="training batch size")
    hyper.add_argument("--warmup-ratio", type=float, default=None, help="linear warmup over this fraction of steps")
    hyper.add_argument("--weight-decay", type=float, default=None, help="AdamW weight decay (not on biases, LayerNorm)")
    hyper.add_argument("--layer-decay", type=float, default=None,
                       help="layer-wise lr decay: layer i gets lr * decay^(L + 1 - i), embeddings decay^(L + 2)")
    hyper.add_argument("--max-length", type=int, default=None, help="truncate inputs to this many tokens")
    hyper.add_argument("--max-train-samples", type=int, default=None,
                       help="train on a fixed random subset of this many examples (quick runs)")
    parser.set_defaults(func=run_command)


def parse_task_lr(items: list[str]) -> dict[str, float]:
    task_lr = {}
    for item in (part for entry in items for part in entry.split(",") if part.strip()):
        name, _, value = item.partition("=")
        try:
            task_lr[name.strip().lower()] = float(value)
        except ValueError:
            raise UsageError(f"--task-lr expects TASK=LR, e.g. qnli=1e-4; got {item!r}") from None
    return task_lr


def default_output_dir(model: str) -> Path:
    """glue/<model folder name>-<fingerprint> for a saved model (two models with one folder name never share
    results), glue/<name> for a hub id."""
    from convattn.training.run_folder import model_identity

    if not Path(model).is_dir():
        return Path("glue") / Path(model).name
    return Path("glue") / f"{Path(model).name}-{model_identity(model)[:8]}"


def run_command(args: argparse.Namespace) -> int:
    from convattn.data.glue import parse_task_list
    from convattn.training.glue import run_glue

    tasks = parse_task_list(args.task)
    for flag, value in (("--seeds", args.seeds), ("--epochs", args.epochs), ("--max-steps", args.max_steps),
                        ("--batch-size", args.batch_size), ("--max-length", args.max_length),
                        ("--max-train-samples", args.max_train_samples)):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be positive, got {value}")
    overrides = {
        "learning_rate": args.lr, "batch_size": args.batch_size, "epochs": args.epochs, "max_steps": args.max_steps,
        "warmup_ratio": args.warmup_ratio, "weight_decay": args.weight_decay, "layer_decay": args.layer_decay,
        "max_length": args.max_length, "max_train_samples": args.max_train_samples,
    }
    output_dir = args.output_dir or default_output_dir(args.model)
    results = run_glue(args.model, tasks, output_dir, data_dir=args.data_dir, recipe=args.recipe, seeds=args.seeds,
                       overrides=overrides, task_lr=parse_task_lr(args.task_lr), from_mnli=args.from_mnli)
    print((output_dir / "glue_results.md").read_text())
    glue = results["glue"]
    if "mean" in glue:
        print(f"GLUE score{'' if glue['complete'] else ' (partial)'}: {glue['mean']:.1f}")
    print(f"results: {output_dir / 'glue_results.json'}")
    return 0
