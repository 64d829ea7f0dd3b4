"""What a pretraining run is asked to do (`PretrainOptions`) and the checks of it made before anything is written
(the checks of what a run already wrote are in runs/)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from convattn.config import ConvAttnConfig
from convattn.console import check_launch_environment, world_size
from convattn.data.formatting import FORMATS
from convattn.data.tokenizer import check_vocab_size
from convattn.errors import UsageError, listed, option
from convattn.runs.checkpoints import check_checkpoint
from convattn.runs.folder import (
    BOOKKEEPING_OPTIONS,
    LOCK_FILE,
    changed_fields,
    changed_options,
    check_only_own_files,
    check_removable,
)
from convattn.runs.pretrain import (
    DATA_FILE,
    EMPTY,
    NOT_A_RUN,
    OPTIONS_FILE,
    UNSTARTED,
    checkpoint_step,
    checkpoints_dir,
    complete_checkpoints,
    foreign_files,
    read_metrics,
    recorded_data,
    recorded_options,
    run_state,
)
from convattn.training.execution import (
    checked_compile_mode,
    compile_difference,
    recorded_compile_mode,
    resolved_precision,
)
from convattn.training.pretrain.budget import CLOCKS, check_budget, time_spent
from convattn.training.ranges import MAX_SEED, MAX_STEPS, RANGES
from convattn.training.recipes import Recipe, warmup_steps

OBJECTIVES = ("mlm", "electra")
# options that may change between a run and its --resume without changing what is computed
# (allow_eval_overlap only permits: the text read is held against the run's record by content)
RESUMABLE_CHANGES = (*BOOKKEEPING_OPTIONS, "eval_every", "save_every", "allow_schedule_change", "compile",
                     "allow_eval_overlap", "compile_difference")
COMPILE_DIFFERENCE = "compile_difference"  # in a compiled run's record: what differs from eager (`compile_difference`)
# options that change the learning-rate schedule of a resumed run: only with --allow-schedule-change
SCHEDULE_CHANGES = ("max_steps", "time_budget", "budget_clock")


def default_cache_dir() -> Path:
    """$CONVATTN_CACHE, or ~/.cache/convattn where it is unset or empty (as the XDG variables are read: an empty
    value would otherwise be the working directory)."""
    return Path(os.environ.get("CONVATTN_CACHE") or Path.home() / ".cache" / "convattn").expanduser()


@dataclass
class PretrainOptions:
    recipe: Recipe
    output_dir: Path
    dataset: str | None = None
    dataset_config: str | None = None
    train_files: list[str] = field(default_factory=list)
    eval_files: list[str] = field(default_factory=list)
    allow_eval_overlap: bool = False  # score on eval text that is training text (recorded: EVAL_IS_TRAIN)
    tokenizer: str | None = None
    cache_dir: Path = field(default_factory=default_cache_dir)
    precision: str = "auto"
    compile: str | None = None  # torch.compile's mode (execution.COMPILE_MODES; None: eager): computes the same
    log_every: int = 10
    resume: bool = False
    overwrite: bool = False
    allow_schedule_change: bool = False  # on --resume: a new max_steps (the lr schedule changes with it)

    def __post_init__(self):
        # `~` expanded once, for every consumer (the Trainer expands it in its output folder, the rest would not)
        self.output_dir, self.cache_dir = Path(self.output_dir).expanduser(), Path(self.cache_dir).expanduser()

    @classmethod
    def from_json(cls, saved: dict) -> PretrainOptions:
        """The options of a run, read back from its OPTIONS_FILE (the inverse of `to_json`)."""
        recipe_fields = {f.name for f in dataclasses.fields(Recipe)}
        option_fields = {f.name for f in dataclasses.fields(cls)} - {"recipe"}
        fields = {k: v for k, v in saved.items() if k in option_fields}
        fields["output_dir"], fields["cache_dir"] = Path(fields["output_dir"]), Path(fields["cache_dir"])
        fields["compile"] = recorded_compile_mode(fields.get("compile"))
        return cls(recipe=Recipe(**{k: v for k, v in saved.items() if k in recipe_fields}), **fields)

    def to_json(self) -> dict:
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "recipe"}
        fields.update(dataclasses.asdict(self.recipe))
        if self.compile is not None:  # the record says what a compiled run computes differently (not an option)
            fields[COMPILE_DIFFERENCE] = compile_difference(self.compile)
        return json.loads(json.dumps(fields, default=str))


def check_options(options: PretrainOptions) -> ConvAttnConfig:
    """Validate what can be validated before reading the corpus; returns the model config (recipe vocab)."""
    check_rank()
    recipe = options.recipe
    if recipe.objective not in OBJECTIVES:
        raise UsageError(f"{option('objective')} {recipe.objective!r} is not known; choose one of "
                         f"{', '.join(OBJECTIVES)}")
    if recipe.format not in FORMATS:
        raise UsageError(f"{option('format')} {recipe.format!r} is not known; choose one of {', '.join(FORMATS)}")
    resolved_precision(options.precision)
    checked_compile_mode(options.compile)
    counts = {name: getattr(recipe, name) for name in ("batch_size", "max_steps", "eval_every", "save_every",
                                                        "gradient_accumulation")}
    if recipe.max_steps is None and recipe.time_budget is None:
        raise UsageError(f"give {option('max_steps')} or {option('time_budget')}: a run ends at a step or a time")
    for name, value in {**counts, "log_every": options.log_every}.items():
        if value is not None and value < 1:
            raise UsageError(f"{option(name)} {value} must be at least 1")
    if recipe.max_steps is not None and recipe.max_steps > MAX_STEPS:
        raise UsageError(f"{option('max_steps')} {recipe.max_steps} is above {MAX_STEPS:,} (years of training at any "
                         f"speed); give fewer steps, or {option('time_budget')} to train for a time")
    check_numbers(recipe)
    if recipe.max_steps is not None and warmup_steps(recipe) >= recipe.max_steps:
        raise UsageError(f"{option('warmup')} {recipe.warmup:g} is not below {option('max_steps')} {recipe.max_steps}: "
                         f"the learning rate would never reach its peak; lower {option('warmup')} (or give a fraction "
                         "of the run, e.g. 0.06)")
    if recipe.time_budget is not None and recipe.max_steps == 1 and recipe.warmup > 0:
        raise UsageError(f"{option('max_steps')} 1 with {option('time_budget')}: the only step runs where the warmup "
                         f"starts, at learning rate 0, so nothing would be trained; give {option('max_steps')} 2 or "
                         f"more, or {option('warmup')} 0")
    if options.tokenizer is None:
        check_vocab_size(recipe.vocab_size)
    config = model_config(recipe)
    seq_len = sequence_length(recipe, config)
    if seq_len > config.max_position_embeddings:
        raise UsageError(
            f"{option('seq_len')} {seq_len} is above the model's maximum of {config.max_position_embeddings} positions "
            f"(preset {recipe.preset}); lower {option('seq_len')} or raise {option('max_position_embeddings')}"
        )
    if seq_len < 8:
        raise UsageError(f"{option('seq_len')} {seq_len} is too short; use at least 8 tokens (the papers use 128)")
    check_kernels_fit(config, seq_len)
    check_fits_memory(config)
    check_batch_fits_memory(recipe, config, seq_len)
    check_output_outside_corpus(options)
    return config


def check_kernels_fit(config: ConvAttnConfig, seq_len: int) -> None:
    """A convolution centred on a token reaches every other token of a sequence with 2 * seq_len - 1 taps; a wider
    kernel only adds padding, and its memory grows with the width (100,001 taps: hundreds of GB)."""
    widest = 2 * seq_len - 1
    kernels = {"conv_kernel_size": config.conv_kernel_size if config.head_ratio > 1 else 0,
               "conv_projection_kernel": config.conv_projection_kernel if config.conv_projections else 0}
    for name, width in kernels.items():
        if width > widest:
            raise UsageError(f"{option(name)} {width} is wider than the {widest} taps that reach every token of "
                             f"a {seq_len}-token sequence ({option('seq_len')}); give at most {widest}")


# bytes a trained parameter takes at least: float32 weight, gradient and AdamW's two moments
TRAINING_BYTES_PER_PARAMETER = 16
# the fields that size a layer's projections and feed-forward, named together
LAYER_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size")


def parameters_at_least(config: ConvAttnConfig) -> dict[str, int]:
    """Lower bounds on the model's parameters, by the config field that sizes them (what every mechanism that uses
    the field has; biases, norms and heads come on top): the layers' projections and feed-forward, the embedding
    tables, the relative-position kernels (`2 * relative_reach + 1` taps a head or channel) and Linformer's
    projections."""
    hidden, layers, taps = config.hidden_size, config.num_hidden_layers, config.relative_kernel_size
    terms = config.relative_terms
    relative = (config.num_self_attention_heads * taps * ("fixed" in terms) +
                query_width(config) * taps * sum(term != "fixed" for term in terms) +
                hidden * taps * config.value_depthwise_conv)
    absolute = config.position_embedding_type == "absolute"
    projected = any(kind != "none" for kind in config.layer_projections)
    return {
        "hidden_size": layers * 4 * hidden * hidden,
        "intermediate_size": layers * 2 * hidden * config.intermediate_size,
        "vocab_size": config.vocab_size * config.embedding_size,
        "type_vocab_size": config.type_vocab_size * config.embedding_size,
        "max_position_embeddings": config.max_position_embeddings * config.embedding_size * absolute,
        "relative_reach": layers * relative,
        "linformer_k": config.linformer_k * config.max_position_embeddings * projected,
    }


def query_width(config: ConvAttnConfig) -> int:
    """The width of one self-attention head's queries, as the attention modules size them (ConvBERT's heads share
    half the hidden size)."""
    if config.uses_convbert:
        return config.hidden_size // 2 // config.num_self_attention_heads
    return config.head_dim


def machine_memory() -> int:
    """The machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits_memory(config: ConvAttnConfig) -> None:
    """Refuse, before anything is built, a model whose training cannot fit the machine's memory (building it would
    take minutes before failing, or ask the system for hundreds of GB), naming the field that sizes most of it."""
    terms = parameters_at_least(config)
    parameters = sum(terms.values())
    needed, available = parameters * TRAINING_BYTES_PER_PARAMETER, machine_memory()
    if needed <= available:
        return
    largest = max(terms, key=terms.get)
    if largest in LAYER_FIELDS:
        sized_by = ", ".join(f"{option(name)} {getattr(config, name)}" for name in LAYER_FIELDS)
    else:
        sized_by = f"{terms[largest] / parameters:.0%} of them from {option(largest)} {getattr(config, largest)}"
    raise UsageError(
        f"the model has at least {parameters:,} parameters ({sized_by}): training needs at least "
        f"{needed / 2**30:,.1f} GiB ({TRAINING_BYTES_PER_PARAMETER} bytes a parameter: weights, gradients, AdamW's "
        f"moments), this machine has {available / 2**30:,.1f} GiB; make the model smaller")


def check_batch_fits_memory(recipe: Recipe, config: ConvAttnConfig, seq_len: int) -> None:
    """Refuse a micro-batch whose activations cannot fit the machine's memory: at least one float32 hidden state
    per token and layer is kept for the backward pass."""
    micro_batch = per_device_batch(recipe)
    needed = micro_batch * seq_len * config.hidden_size * config.num_hidden_layers * 4
    if needed > machine_memory():
        raise UsageError(
            f"a micro-batch of {micro_batch:,} examples x {seq_len} tokens ({option('batch_size')} "
            f"{recipe.batch_size} over {world_size()} process(es) x {recipe.gradient_accumulation} accumulation "
            f"step(s)) keeps at least {needed / 2**30:,.1f} GiB of activations for the backward pass, this machine "
            f"has {machine_memory() / 2**30:,.1f} GiB; lower {option('batch_size')} or raise "
            f"{option('gradient_accumulation')}")


def check_rank() -> None:
    """A RANK other than 0 left in the environment of a process that runs alone (no launcher set WORLD_SIZE) would
    make it write the run as the only process while it skips the folder's lock, which only rank 0 takes; and the
    launcher's variables are numbers, none left over (`check_launch_environment`)."""
    check_launch_environment()
    rank = os.environ.get("RANK", "0").strip()
    if rank != "0" and world_size() == 1:
        raise UsageError(f"RANK={rank} is set, but this process runs alone (WORLD_SIZE is "
                         f"{os.environ.get('WORLD_SIZE', 'unset')}): a leftover of another launch; unset RANK (e.g. "
                         "env -u RANK convattn ...), or start several processes with torchrun --nproc-per-node N")


def check_output_outside_corpus(options: PretrainOptions) -> None:
    """A run folder inside a corpus folder would be read as text: its next run, or its --resume, reads models."""
    out = Path(options.output_dir).resolve()
    for flag, paths in ((option("train_file"), options.train_files), (option("eval_file"), options.eval_files)):
        for path in map(Path, paths):
            if path.is_dir() and out.is_relative_to(path.resolve()):
                raise UsageError(f"{option('output_dir')} {options.output_dir} is inside {flag} {path}: the run's "
                                 "models and checkpoints would be read as text; choose an output folder outside the "
                                 "corpus folder")


# the real-valued recipe fields: each finite and in its interval of RANGES
REAL_FIELDS = ("learning_rate", "weight_decay", "adam_epsilon", "adam_beta1", "adam_beta2", "warmup", "max_grad_norm",
               "mlm_probability")


def check_numbers(recipe: Recipe) -> None:
    """Every real-valued recipe field finite and in its range; counts at least 1; one line naming the flag."""
    for name in REAL_FIELDS:
        value = getattr(recipe, name)
        if not RANGES[name].allows(value):
            raise UsageError(f"{option(name)} {value} must be a finite number in {RANGES[name].interval}")
    if recipe.eval_samples is not None and recipe.eval_samples < 1:
        raise UsageError(f"{option('eval_samples')} {recipe.eval_samples} must be at least 1 (leave it out to use "
                         "every eval example)")
    if recipe.budget_clock not in CLOCKS:
        raise UsageError(f"{option('budget_clock')} {recipe.budget_clock!r} is not known; choose one of "
                         f"{', '.join(CLOCKS)}")
    if recipe.time_budget is not None:
        if not (isinstance(recipe.time_budget, int | float) and math.isfinite(recipe.time_budget) and
                recipe.time_budget > 0):
            raise UsageError(f"{option('time_budget')} {recipe.time_budget} must be a positive number of seconds")
        check_budget(recipe.time_budget, recipe.time_budget)
        if recipe.warmup >= 1:
            raise UsageError(f"{option('warmup')} {recipe.warmup:g} is in steps, but a time-budget run warms up over "
                             "a fraction of its budget: give a fraction below 1, e.g. 0.06")
    if not 0 <= recipe.seed <= MAX_SEED:
        raise UsageError(f"{option('seed')} {recipe.seed} must be in [0, {MAX_SEED}]")


def model_config(recipe: Recipe) -> ConvAttnConfig:
    """The model config of a run: the recipe's preset and config fields (the tokenizer's come in `build_model`)."""
    return ConvAttnConfig.from_preset(recipe.preset, **recipe.model)


def sequence_length(recipe: Recipe, config: ConvAttnConfig) -> int:
    """Tokens per example: the recipe's, else the model's maximum."""
    return config.max_position_embeddings if recipe.seq_len is None else recipe.seq_len


def per_device_batch(recipe: Recipe) -> int:
    processes = world_size() * recipe.gradient_accumulation
    if recipe.batch_size % processes:
        raise UsageError(
            f"{option('batch_size')} {recipe.batch_size} must divide evenly over {world_size()} process(es) x "
            f"{recipe.gradient_accumulation} accumulation step(s); change {option('batch_size')} or "
            f"{option('gradient_accumulation')}"
        )
    return recipe.batch_size // processes


@dataclass
class OutputPlan:
    """What the run does with its output directory."""

    resume_from: Path | None = None  # the checkpoint to continue from
    schedule_ended: bool = False  # --resume of a run whose last checkpoint is its last step (or spent budget)
    replace: bool = False  # remove the old run's files once the new run is ready to write


def held_names(out: Path) -> list[str]:
    """What `out` holds that a pretraining run did not write (its top-level names when all of it could be a run's:
    a run's leftovers without its record), for a message."""
    return foreign_files(out) or sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir()
                                        if p.name != LOCK_FILE)


def check_output_dir(options: PretrainOptions) -> OutputPlan:
    """What to do with `options.output_dir` (a folder: `check_output_folder`); raises, before anything is written,
    when it is in the way."""
    out = options.output_dir
    if options.resume:
        return resume_plan(options)
    state = run_state(out)
    if state == EMPTY:
        return OutputPlan()
    if state == NOT_A_RUN and not options.overwrite:  # a user's files, or a run's leftovers without its record
        raise UsageError(f"{option('output_dir')} {out} is not empty: it holds {listed(held_names(out))} and no "
                         f"pretraining run to continue or replace; move those out, or choose another "
                         f"{option('output_dir')}")
    if not options.overwrite and state != UNSTARTED:
        raise UsageError(f"{option('output_dir')} {out} is not empty: it holds a pretraining run ({state}); continue "
                         f"that run with {option('resume')}, replace it with {option('overwrite')}, or choose another "
                         f"{option('output_dir')}")
    flag = option("overwrite") if options.overwrite else option("output_dir")
    check_removable(out, OPTIONS_FILE, flag)
    check_only_own_files(out, foreign_files(out), flag)
    return OutputPlan(replace=True)


def check_resumed_options(saved: dict, options: PretrainOptions) -> None:
    """Refuse options of a --resume that differ from those the run in `options.output_dir` was started with, naming
    each changed option and the way to go on: drop it (the run's own options are read from the run), or, for a
    schedule change (`SCHEDULE_CHANGES`), add --allow-schedule-change."""
    allowed = RESUMABLE_CHANGES + (SCHEDULE_CHANGES if options.allow_schedule_change else ())
    current = options.to_json()
    changed = changed_fields(saved, current, allowed)
    if not changed:
        return
    named = lambda fields: ", ".join(option(k) for k in fields)  # noqa: E731
    fixed = [k for k in changed if k not in SCHEDULE_CHANGES]
    schedule = [k for k in changed if k in SCHEDULE_CHANGES]
    fixes = [f"drop {named(changed)} (the run's own options are read from it)"]
    if schedule:
        fixes.append(f"{'drop ' + named(fixed) + ' and ' if fixed else ''}add {option('allow_schedule_change')} to "
                     f"change {named(schedule)}")
    raise UsageError(f"{option('resume')}: options differ from the run in {options.output_dir} "
                     f"({changed_options(saved, current, allowed, name=option)}); {', or '.join(fixes)}")


def resume_plan(options: PretrainOptions) -> OutputPlan:
    out, recipe = options.output_dir, options.recipe
    resume, max_steps = option("resume"), option("max_steps")
    checkpoints = complete_checkpoints(checkpoints_dir(out))
    if not checkpoints:
        if out.is_dir() and (out / OPTIONS_FILE).is_file():
            raise UsageError(f"{resume}: the run in {out} stopped before its first checkpoint, so there is nothing to "
                             f"continue; run the same command without {resume} to start it again")
        held = held_names(out) if out.is_dir() else []
        raise UsageError(f"{resume}: {out} holds no run to continue"
                         + (f" (it holds {listed(held)}, which no run wrote there)" if held else "")
                         + f"; drop {resume} to start one" + (" in another folder" if held else ""))
    saved = recorded_options(out / OPTIONS_FILE)
    if saved is None:
        raise UsageError(f"{resume}: {out} has checkpoints but no {OPTIONS_FILE} (the options it was started with), "
                         "so what it continues cannot be checked; restore that file, or start a new run in another "
                         f"{option('output_dir')}")
    read_metrics(out)  # damaged run files are named now, not once the run is under way
    recorded_data(out / DATA_FILE)
    check_resumed_options(saved, options)
    check_checkpoint(checkpoints)
    reached = checkpoint_step(checkpoints[-1])
    if recipe.max_steps is not None and reached > recipe.max_steps:
        raise UsageError(f"{max_steps} {recipe.max_steps} is below step {reached}, which the run in {out} has already "
                         f"reached; give {max_steps} {reached} or more")
    spent = time_spent(checkpoints[-1]).get(recipe.budget_clock, 0.0)
    budget_spent = recipe.time_budget is not None and spent >= recipe.time_budget
    return OutputPlan(resume_from=checkpoints[-1], schedule_ended=reached == recipe.max_steps or budget_spent)
