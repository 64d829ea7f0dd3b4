"""The command line's shared vocabulary: one help formatter and the argument groups that several commands use
(model architecture, data, training recipe, schedule, a comparison's runs, fine-tuning overrides); pretrain_flags.py,
compare_flags.py and fine_tune_flags.py read them back into options. Choices are read from the shipped recipe files,
never listed by hand."""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path

from convattn.errors import UsageError
from convattn.training.execution import COMPILE_MODES, PRECISIONS, compile_mode
from convattn.training.finetune.recipes import fine_tune_recipe_names
from convattn.training.recipes import recipe_names

HUB_DEFAULT = ("Salesforce/wikitext", "wikitext-103-raw-v1")


# architecture flags -> ConvAttnConfig fields
ARCHITECTURE_FLAGS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "intermediate": "intermediate_size",
    "embedding_size": "embedding_size",
    "max_len": "max_position_embeddings",
}


# training flags -> Recipe fields (None on the command line: keep the recipe's value)
RECIPE_FLAGS = ("objective", "format", "vocab_size", "seq_len", "batch_size", "gradient_accumulation",
                "learning_rate", "weight_decay", "adam_epsilon", "warmup", "max_grad_norm", "mlm_probability",
                "max_steps", "time_budget", "budget_clock", "eval_every", "save_every", "eval_samples", "seed")


def user_path(text: str) -> Path:
    """argparse type of a path flag: `~` expanded here, once, so that every consumer reads the same folder (a quoted
    '~/x' was ./~/x to convattn and ~/x to the Trainer, which expands it itself)."""
    return Path(text).expanduser()


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's layout and shows defaults, except where the default means "unset" (None, False, [])."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        if action.default in (None, False, [], argparse.SUPPRESS) or "%(default)" in help_text:
            return help_text
        return help_text + " (default: %(default)s)"


# The argument groups below are shared with `convattn compare` and `convattn plot kernel-size`, which run
# pretraining for several models with the same data and budget.
@functools.cache
def _default_recipe():
    from convattn.training.recipes import load_recipe

    return load_recipe("default")


def _default_recipe_value(name: str) -> str:
    """The default recipe's value of a field, for the help text."""
    return f" [default recipe: {getattr(_default_recipe(), name)}]"


def _no_value(name: str) -> str:
    return ""


def add_architecture_arguments(group) -> None:
    """--layers, --hidden, ... (ARCHITECTURE_FLAGS) and --set FIELD=VALUE; read back by `config_overrides`."""
    group.add_argument("--layers", type=int, metavar="N", help="number of layers (num_hidden_layers)")
    group.add_argument("--hidden", type=int, metavar="N", help="hidden size (hidden_size)")
    group.add_argument("--heads", type=int, metavar="N", help="attention heads (num_attention_heads)")
    group.add_argument("--intermediate", type=int, metavar="N", help="feed-forward size (intermediate_size)")
    group.add_argument("--embedding-size", type=int, metavar="N", help="embedding size (embedding_size)")
    group.add_argument("--max-len", type=int, metavar="N", help="maximum sequence length (max_position_embeddings)")
    group.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                       help="any config field, e.g. --set relative_terms=[fixed] --set hidden_dropout_prob=0 "
                            "(repeatable; VALUE is YAML)")


def add_data_arguments(group, recipe_defaults: bool = True) -> None:
    """The corpus, tokenizer and formatting; `recipe_defaults` shows the default recipe's values in the help."""
    shown = _default_recipe_value if recipe_defaults else _no_value
    group.add_argument("--dataset", nargs="?", const=HUB_DEFAULT[0], metavar="HUB_NAME",
                       help=f"HuggingFace hub dataset with a 'text' column (bare --dataset: {HUB_DEFAULT[0]}); "
                            "default: the embedded corpus (installed documentation, no network)")
    group.add_argument("--dataset-config", metavar="CFG",
                       help=f"hub dataset config (for {HUB_DEFAULT[0]}: {HUB_DEFAULT[1]})")
    group.add_argument("--train-file", nargs="+", action="extend", default=[], type=os.path.expanduser, metavar="PATH",
                       help="local text: files, directories or globs (one line or paragraph per line)")
    group.add_argument("--eval-file", nargs="+", action="extend", default=[], type=os.path.expanduser, metavar="PATH",
                       help="held-out text (default: the dataset's validation split, or the last 1%% of the train "
                            "text up to 5000 lines)")
    group.add_argument("--allow-eval-overlap", action="store_true",
                       help="score on --eval-file text that is also training text (refused otherwise: the same "
                            "file, a link to it, a copy, or mostly training lines); the run's record and report "
                            "then say 'eval text is training text'")
    group.add_argument("--tokenizer", metavar="DIR", type=os.path.expanduser,
                       help="use this tokenizer directory (ours or any HF one) instead of training one")
    group.add_argument("--vocab-size", type=int, metavar="N",
                       help="size of the unigram tokenizer to train (special tokens included)" + shown("vocab_size"))
    group.add_argument("--seq-len", type=int, metavar="N",
                       help="tokens per example (default: the model's maximum)" + shown("seq_len"))
    group.add_argument("--format", choices=("pairs", "packed"),
                       help="pairs: [CLS] line [SEP] next line [SEP] (Chang et al.); packed: full blocks of "
                            "concatenated text (Conv-Linformer)")
    group.add_argument("--eval-samples", type=int, metavar="N",
                       help="evaluate on the first N eval examples only" + shown("eval_samples"))
    group.add_argument("--cache-dir", type=user_path, default=None,
                       help="where tokenizers and formatted data are cached (default: $CONVATTN_CACHE or "
                            "~/.cache/convattn)")


def add_training_arguments(group, recipe_help: str, seed: bool = True, recipe_defaults: bool = True) -> None:
    """The recipe and its training fields; `seed=False` leaves out --seed (for commands that run several)."""
    shown = _default_recipe_value if recipe_defaults else _no_value
    group.add_argument("--recipe", metavar="NAME",
                       help=f"named protocol: {', '.join(recipe_names())} {recipe_help}")
    group.add_argument("--objective", choices=("mlm", "electra"),
                       help="masked LM (15%%, 80/10/10) or ELECTRA replaced-token detection")
    group.add_argument("--batch-size", type=int, metavar="N",
                       help="examples per optimizer step, over all processes" + shown("batch_size"))
    group.add_argument("--gradient-accumulation", type=int, metavar="N",
                       help="micro-batches per optimizer step" + shown("gradient_accumulation"))
    group.add_argument("--max-steps", type=int, metavar="N", help="optimizer steps" + shown("max_steps"))
    group.add_argument("--time-budget", type=duration, metavar="DURATION",
                       help="train for this long instead (e.g. 90s, 30m, 2h: training time, evaluation not counted): "
                            "the lr warms up over --warmup of it and decays to 0 at the deadline; with --max-steps, "
                            "whichever ends first")
    group.add_argument("--budget-clock", choices=("compute", "wall"),
                       help="what --time-budget counts: compute (CPU seconds per thread, or the GPU's own time: other "
                            "processes on the machine do not move it) or wall (the wall clock's time, which they do)"
                            + shown("budget_clock"))
    group.add_argument("--lr", dest="learning_rate", type=float, metavar="X",
                       help="peak learning rate" + shown("learning_rate"))
    group.add_argument("--weight-decay", type=float, metavar="X",
                       help="AdamW weight decay (never on biases or LayerNorm)" + shown("weight_decay"))
    group.add_argument("--adam-epsilon", type=float, metavar="X", help="AdamW epsilon" + shown("adam_epsilon"))
    group.add_argument("--warmup", type=float, metavar="X",
                       help="linear warmup steps, or a fraction of --max-steps if below 1" + shown("warmup"))
    group.add_argument("--max-grad-norm", type=float, metavar="X", help="gradient clipping" + shown("max_grad_norm"))
    group.add_argument("--mlm-probability", type=float, metavar="X",
                       help="fraction of tokens masked (ELECTRA: for its generator)" + shown("mlm_probability"))
    add_execution_arguments(group)
    if seed:
        group.add_argument("--seed", type=int, metavar="N",
                           help="seed for initialisation, data order and masking" + shown("seed"))


def add_execution_arguments(group) -> None:
    """--precision, --compile and --compile-mode: how a training command runs (pretrain, compare, glue, squad)."""
    group.add_argument("--precision", choices=PRECISIONS, default="auto",
                       help="auto: bf16 (or fp16) on GPUs that have it, fp32 on CPU; bf16 also runs on CPU (autocast)")
    group.add_argument("--compile", action="store_true",
                       help="torch.compile the model (faster on GPUs, the first steps slower): the same "
                            "computation, but with dropout on, the same --seed gives other losses than eager (on "
                            "CPU only where eager runs a batch padding-free, or fine-tuning pads it to a multiple of "
                            "64; on a GPU everywhere); the run says so and records it")
    group.add_argument("--compile-mode", choices=COMPILE_MODES,
                       help="torch.compile's mode, implies --compile: default; reduce-overhead replays each step as "
                            "CUDA graphs, the host out of it (GPUs; one graph per batch shape; without a GPU it "
                            "runs as default, and says so); max-autotune also "
                            "times inductor's kernel choices (minutes more to compile)")


def compile_mode_asked(args: argparse.Namespace) -> str | None:
    """The torch.compile mode --compile and --compile-mode ask for; None: eager."""
    return compile_mode(args.compile, args.compile_mode)


def duration(text: str) -> float:
    """argparse type of --time-budget: seconds."""
    from convattn.training.pretrain.budget import parse_duration

    try:
        return parse_duration(text)
    except UsageError as err:
        raise argparse.ArgumentTypeError(err.describe(lambda field: "").strip()) from None


def add_schedule_arguments(group, recipe_defaults: bool = True) -> None:
    shown = _default_recipe_value if recipe_defaults else _no_value
    group.add_argument("--eval-every", type=int, metavar="N", help="evaluate every N steps" + shown("eval_every"))
    group.add_argument("--save-every", type=int, metavar="N", help="checkpoint every N steps" + shown("save_every"))
    group.add_argument("--log-every", type=int, default=10, help="log train loss and tokens/s every N steps")
    add_verbose_argument(group)


def add_verbose_argument(parser) -> None:
    parser.add_argument("--verbose", action="store_true",
                        help="show the libraries' own output live (load reports, Trainer logs, progress bars of "
                             "data preparation); without it they go to OUTPUT_DIR/log.txt")


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
    glue.add_argument("--glue-data-dir", type=user_path, metavar="DIR",
                      help="glue_data directory in the GLUE TSV layout (default: nyu-mll/glue from the HF hub)")
    glue.add_argument("--glue-recipe", choices=fine_tune_recipe_names("glue"), default="chang2021",
                      help="fine-tuning hyperparameters")
    glue.add_argument("--glue-seeds", type=int, default=1, metavar="N", help="fine-tuning seeds per model")
    glue.add_argument("--glue-max-steps", type=int, metavar="N",
                      help="fine-tuning steps (default: the recipe's epochs)")
    glue.add_argument("--glue-max-train-samples", type=int, metavar="N",
                      help="fine-tune on a fixed random subset of this many examples")

    squad = parser.add_argument_group("SQuAD fine-tuning of each final model (optional; see `convattn squad`)")
    squad.add_argument("--squad", choices=("1.1", "2.0"), metavar="VERSION", help="SQuAD version: 1.1 or 2.0")
    squad.add_argument("--squad-train-file", type=user_path, metavar="FILE",
                       help="training questions, official SQuAD JSON (default: the HF hub)")
    squad.add_argument("--squad-dev-file", type=user_path, metavar="FILE",
                       help="dev questions, official SQuAD JSON (default: the HF hub)")
    squad.add_argument("--squad-seeds", type=int, default=1, metavar="N", help="fine-tuning seeds per model")
    squad.add_argument("--squad-max-steps", type=int, metavar="N",
                       help="fine-tuning steps (default: the recipe's 2 epochs)")
    squad.add_argument("--squad-max-length", type=int, metavar="N", help="window length in tokens (default: 512)")

    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", type=user_path,
                        help=f"where the runs and the report go (default: {default_output})")
    add_schedule_arguments(output, recipe_defaults=False)
    output.add_argument("--report-only", action="store_true",
                        help="rebuild the report from the runs in --output-dir without training (their settings "
                             "and seeds are read from the run directories)")


def add_fine_tune_arguments(parser: argparse.ArgumentParser):
    """Hyperparameter overrides shared by `convattn glue` and `convattn squad` (each dest a settings field);
    returns the group for more."""
    hyper = parser.add_argument_group("hyperparameter overrides (default: the recipe's)")
    length = hyper.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=float, default=None, help="training epochs")
    length.add_argument("--max-steps", type=int, default=None, help="training steps (instead of epochs)")
    hyper.add_argument("--lr", dest="learning_rate", metavar="LR", type=float, default=None, help="peak learning rate")
    hyper.add_argument("--batch-size", type=int, default=None, help="training batch size")
    hyper.add_argument("--warmup-ratio", type=float, default=None, help="linear warmup over this fraction of steps")
    hyper.add_argument("--weight-decay", type=float, default=None, help="AdamW weight decay (not on biases, LayerNorm)")
    hyper.add_argument("--layer-decay", type=float, default=None,
                       help="layer-wise lr decay: layer i gets lr * decay^(L + 1 - i), embeddings decay^(L + 2)")
    hyper.add_argument("--max-length", type=int, default=None, help="truncate inputs to this many tokens")
    hyper.add_argument("--max-train-samples", type=int, default=None,
                       help="train on a fixed random subset of this many examples (quick runs)")
    add_execution_arguments(parser.add_argument_group("how it runs"))
    parser.add_argument("--save-models", choices=("best", "all", "none"), default="best",
                        help="fine-tuned models to keep: the best dev seed's as OUTPUT_DIR/models/<task>/ (best), "
                             "also every seed's in its run folder (all), or none")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results --output-dir holds (never anything else): kept until the new job "
                             "finishes its first seed, given back if it fails or is stopped before")
    return hyper
