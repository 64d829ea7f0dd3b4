"""The command line's shared vocabulary: one help formatter and the argument groups that several commands use
(model architecture, data, training recipe, schedule, a comparison's runs), with the functions that read them
back into options. Choices are read from the shipped recipe files, never listed by hand."""

from __future__ import annotations

import argparse
import difflib
import functools
import signal
import threading
from pathlib import Path

import yaml

from convattn.errors import UsageError
from convattn.training.recipes import glue_recipe_names, recipe_names

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
                "max_steps", "eval_every", "save_every", "eval_samples", "seed")


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
    group.add_argument("--train-file", nargs="+", action="extend", default=[], metavar="PATH",
                       help="local text: files, directories or globs (one line or paragraph per line)")
    group.add_argument("--eval-file", nargs="+", action="extend", default=[], metavar="PATH",
                       help="held-out text (default: the dataset's validation split, or the last 1%% of the train "
                            "text up to 5000 lines)")
    group.add_argument("--tokenizer", metavar="DIR",
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
    group.add_argument("--cache-dir", type=Path, default=None,
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
    group.add_argument("--lr", dest="learning_rate", type=float, metavar="X",
                       help="peak learning rate" + shown("learning_rate"))
    group.add_argument("--weight-decay", type=float, metavar="X",
                       help="AdamW weight decay (never on biases or LayerNorm)" + shown("weight_decay"))
    group.add_argument("--adam-epsilon", type=float, metavar="X", help="AdamW epsilon" + shown("adam_epsilon"))
    group.add_argument("--warmup", type=float, metavar="X",
                       help="linear warmup steps, or a fraction of --max-steps if below 1" + shown("warmup"))
    group.add_argument("--max-grad-norm", type=float, metavar="X", help="gradient clipping" + shown("max_grad_norm"))
    group.add_argument("--mlm-probability", type=float, metavar="X",
                       help="fraction of tokens masked" + shown("mlm_probability"))
    group.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                       help="auto: bf16 (or fp16) on GPUs that have it, fp32 on CPU; bf16 also runs on CPU (autocast)")
    if seed:
        group.add_argument("--seed", type=int, metavar="N",
                           help="seed for initialisation, data order and masking" + shown("seed"))


def add_schedule_arguments(group, recipe_defaults: bool = True) -> None:
    shown = _default_recipe_value if recipe_defaults else _no_value
    group.add_argument("--eval-every", type=int, metavar="N", help="evaluate every N steps" + shown("eval_every"))
    group.add_argument("--save-every", type=int, metavar="N", help="checkpoint every N steps" + shown("save_every"))
    group.add_argument("--log-every", type=int, default=10, help="log train loss and tokens/s every N steps")
    add_verbose_argument(group)


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
        overrides[name] = checked_value(name, yaml.safe_load(value), getattr(ConvAttnConfig, name, None))
    return overrides


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
    return dict(dataset=args.dataset, dataset_config=dataset_config, train_files=args.train_file,
                eval_files=args.eval_file, tokenizer=args.tokenizer, cache_dir=args.cache_dir or default_cache_dir())


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt


def add_verbose_argument(parser) -> None:
    parser.add_argument("--verbose", action="store_true",
                        help="show the libraries' own output live (load reports, Trainer logs, progress bars of "
                             "data preparation); without it they go to OUTPUT_DIR/log.txt")


def prepare_training_process() -> None:
    """Make a kill stop like Ctrl-C, so checkpoints stay intact."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop_on_sigterm)


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
    glue.add_argument("--glue-recipe", choices=glue_recipe_names(), default="chang2021",
                      help="fine-tuning hyperparameters")
    glue.add_argument("--glue-seeds", type=int, default=1, metavar="N", help="fine-tuning seeds per model")
    glue.add_argument("--glue-max-steps", type=int, metavar="N",
                      help="fine-tuning steps (default: the recipe's epochs)")
    glue.add_argument("--glue-max-train-samples", type=int, metavar="N",
                      help="fine-tune on a fixed random subset of this many examples")

    squad = parser.add_argument_group("SQuAD fine-tuning of each final model (optional; see `convattn squad`)")
    squad.add_argument("--squad", choices=("1.1", "2.0"), metavar="VERSION", help="SQuAD version: 1.1 or 2.0")
    squad.add_argument("--squad-train-file", type=Path, metavar="FILE",
                       help="training questions, official SQuAD JSON (default: the HF hub)")
    squad.add_argument("--squad-dev-file", type=Path, metavar="FILE",
                       help="dev questions, official SQuAD JSON (default: the HF hub)")
    squad.add_argument("--squad-seeds", type=int, default=1, metavar="N", help="fine-tuning seeds per model")
    squad.add_argument("--squad-max-steps", type=int, metavar="N",
                       help="fine-tuning steps (default: the recipe's 2 epochs)")
    squad.add_argument("--squad-max-length", type=int, metavar="N", help="window length in tokens (default: 512)")

    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", type=Path, help=f"where the runs and the report go (default: {default_output})")
    add_schedule_arguments(output, recipe_defaults=False)
    output.add_argument("--report-only", action="store_true",
                        help="rebuild the report from the runs in --output-dir without training (their settings "
                             "and seeds are read from the run directories)")


def add_fine_tune_arguments(parser: argparse.ArgumentParser):
    """Hyperparameter overrides shared by `convattn glue` and `convattn squad`; returns the group for more."""
    hyper = parser.add_argument_group("hyperparameter overrides (default: the recipe's)")
    length = hyper.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=float, default=None, help="training epochs")
    length.add_argument("--max-steps", type=int, default=None, help="training steps (instead of epochs)")
    hyper.add_argument("--lr", type=float, default=None, help="peak learning rate")
    hyper.add_argument("--batch-size", type=int, default=None, help="training batch size")
    hyper.add_argument("--warmup-ratio", type=float, default=None, help="linear warmup over this fraction of steps")
    hyper.add_argument("--weight-decay", type=float, default=None, help="AdamW weight decay (not on biases, LayerNorm)")
    hyper.add_argument("--layer-decay", type=float, default=None,
                       help="layer-wise lr decay: layer i gets lr * decay^(L + 1 - i), embeddings decay^(L + 2)")
    hyper.add_argument("--max-length", type=int, default=None, help="truncate inputs to this many tokens")
    hyper.add_argument("--max-train-samples", type=int, default=None,
                       help="train on a fixed random subset of this many examples (quick runs)")
    return hyper


FINE_TUNE_FIELDS = {"lr": "learning_rate", "batch_size": "batch_size", "epochs": "epochs", "max_steps": "max_steps",
                    "warmup_ratio": "warmup_ratio", "weight_decay": "weight_decay", "layer_decay": "layer_decay",
                    "max_length": "max_length", "max_train_samples": "max_train_samples"}
POSITIVE_FLAGS = ("max_steps", "batch_size", "max_train_samples")
MAX_EPOCHS = 10_000


def fine_tune_overrides(args: argparse.Namespace, extra: tuple[str, ...] = ()) -> dict:
    """The settings fields given on the command line (None: the recipe's), each checked against its range (one
    UsageError naming the flag and the allowed values). `extra`: more positive integer flags (dest) that map to
    the field of the same name. --max-length is checked against the model once it is loaded."""
    import math

    ranges = {  # dest -> (test, the allowed values in words)
        "lr": (lambda v: 0 < v < math.inf, "a finite number > 0"),
        "weight_decay": (lambda v: 0 <= v < math.inf, "a finite number >= 0"),
        "layer_decay": (lambda v: 0 < v <= 1, "a number in (0, 1] (1: no decay)"),
        "warmup_ratio": (lambda v: 0 <= v < 1, "a fraction in [0, 1)"),
        "epochs": (lambda v: 0 < v <= MAX_EPOCHS, f"a number in (0, {MAX_EPOCHS:,}]"),
        "max_length": (lambda v: v >= 1, "an integer >= 1 (tokens per input)"),
        **{name: (lambda v: v >= 1, "an integer >= 1") for name in (*POSITIVE_FLAGS, *extra)},
    }
    for name, (allowed, words) in ranges.items():
        value = getattr(args, name, None)
        if value is not None and not allowed(value):  # NaN fails every comparison
            raise UsageError(f"--{name.replace('_', '-')} {value} must be {words}")
    fields = {**FINE_TUNE_FIELDS, **{name: name for name in extra}}
    return {field: getattr(args, flag) for flag, field in fields.items()}


def model_output_dir(command: str, model: str) -> Path:
    """<command>/<model folder name>-<fingerprint> for a saved model (two models with one folder name never share
    results), <command>/<name> for a hub id."""
    from convattn.files import model_identity

    if not Path(model).is_dir():
        return Path(command) / Path(model).name
    return Path(command) / f"{Path(model).name}-{model_identity(model)[:8]}"


def glue_request(args: argparse.Namespace):
    from convattn.data.glue import parse_task_list
    from convattn.training.compare.options import GlueRequest

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


def squad_request(args: argparse.Namespace):
    from convattn.training.compare.options import SquadRequest

    flags = {"--squad-train-file": args.squad_train_file, "--squad-dev-file": args.squad_dev_file,
             "--squad-max-steps": args.squad_max_steps, "--squad-max-length": args.squad_max_length}
    given = [flag for flag, value in flags.items() if value is not None]
    if not args.squad:
        if given:
            raise UsageError(f"{', '.join(given)} need(s) --squad VERSION")
        return None
    if (args.squad_train_file is None) != (args.squad_dev_file is None):
        raise UsageError("give both --squad-train-file and --squad-dev-file (local files), or neither (the HF hub)")
    for flag, value in (("--squad-seeds", args.squad_seeds), ("--squad-max-steps", args.squad_max_steps),
                        ("--squad-max-length", args.squad_max_length)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value} must be at least 1")
    overrides = {"max_steps": args.squad_max_steps, "max_length": args.squad_max_length}
    return SquadRequest(args.squad, args.squad_train_file, args.squad_dev_file, args.squad_seeds, overrides)


def compare_options(args: argparse.Namespace, grid, default_output: Path):
    """CompareOptions from the shared run arguments (`add_run_arguments`) and a grid."""
    from convattn.training.compare.options import CompareOptions

    return CompareOptions(
        grid=grid, output_dir=args.output_dir or default_output, data=data_options(args), seeds=args.seeds,
        recipe=args.recipe, model=config_overrides(args), training=recipe_overrides(args), precision=args.precision,
        log_every=args.log_every, glue=glue_request(args), squad=squad_request(args),
    )
