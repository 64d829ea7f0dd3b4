"""Comparing models on one pretraining budget (`convattn compare`, `convattn plot kernel-size`).

Every run of a comparison gets the same data, the same tokenizer, the same recipe and budget, and the same
seeds (seed k sets initialisation, data order and masking). Layout of the output directory:

    tokenizer/                  the one tokenizer of every run (trained once here, unless given)
    runs/<run>/seed<k>/         a normal `convattn pretrain` output directory per run and seed
    runs/<run>/seed<k>/glue/    `convattn glue` output, when GLUE tasks are asked for
    runs/<run>/seed<k>/squad/   `convattn squad` output, when a SQuAD version is asked for
    runs/<run>/memory.json      the run's training-memory measurement
    report.md, report.html      one table row per run, settings, the figure  (compare_report.py, compare_results.py)
    perplexity.png              eval perplexity vs training step, one line per run
    metrics.csv                 one row per run x seed x evaluation
    summary.csv                 one row per run

A run directory whose final model and metrics exist is reused as it is; one with a checkpoint resumes from
it; anything else starts again.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from convattn.console import log_to
from convattn.console import say as say_as
from convattn.errors import UsageError
from convattn.files import read_json, write_json_atomic
from convattn.training.grids import Grid, RunSpec, check_runs
from convattn.training.memory import saved_activation_bytes
from convattn.training.pretrain import (
    METRICS_FILE,
    OPTIONS_FILE,
    PretrainOptions,
    build_model,
    check_options,
    complete_checkpoints,
    per_device_batch,
    pretrain,
    sequence_length,
)
from convattn.training.recipes import Recipe, apply_overrides, load_recipe, recipe_for_preset
from convattn.training.run_folder import BOOKKEEPING_OPTIONS, check_same_options, seed_dir

MEMORY_FILE = "memory.json"
TOKENIZER_RECORD = "compare_tokenizer.json"  # beside the shared tokenizer: what it was trained for


# ---------------------------------------------------------------------------------- options
@dataclass
class GlueRequest:
    """Fine-tune each final model on GLUE tasks (`convattn glue` machinery) and report the dev scores."""

    tasks: list[str]
    data_dir: Path | None = None
    recipe: str = "chang2021"
    seeds: int = 1
    overrides: dict = field(default_factory=dict)  # FineTuneSettings fields, e.g. max_steps, max_train_samples


@dataclass
class SquadRequest:
    """Fine-tune each final model on SQuAD (`convattn squad` machinery) and report dev EM and F1."""

    version: str
    train_file: Path | None = None
    dev_file: Path | None = None
    seeds: int = 1
    overrides: dict = field(default_factory=dict)  # SquadSettings fields, e.g. max_steps, max_length


@dataclass
class CompareOptions:
    grid: Grid
    output_dir: Path
    data: dict  # PretrainOptions data fields: dataset, dataset_config, train_files, eval_files, tokenizer, cache_dir
    seeds: int = 3
    recipe: str | None = None  # wins over the grid's; default: the grid's, else the first run's paper
    model: dict = field(default_factory=dict)  # config fields for every run, over the grid's and the runs' own
    training: dict = field(default_factory=dict)  # Recipe fields for every run, over the grid's
    precision: str = "auto"
    log_every: int = 10
    glue: GlueRequest | None = None
    squad: SquadRequest | None = None

    @property
    def recipe_name(self) -> str:
        return self.recipe or self.grid.recipe or recipe_for_preset(self.grid.runs[0].preset)


def run_recipe(options: CompareOptions, spec: RunSpec, seed: int) -> Recipe:
    """The recipe of one run: recipe file < grid < the run's own fields < command line; the seed is the run's."""
    recipe = load_recipe(options.recipe_name)
    if options.recipe is None and options.grid.recipe is None and options.recipe_name == "default":
        recipe.model = {}  # as in `convattn pretrain`: the default recipe's size only applies to its own preset
    recipe.preset = spec.preset
    recipe.model = {**recipe.model, **options.grid.model, **spec.model, **options.model}
    note = apply_overrides(recipe, {**options.grid.training, **options.training})
    if note and seed == 0:
        say(f"{spec.name}: {note}")
    recipe.seed = seed
    return recipe


def run_dir(output_dir: Path, spec: RunSpec, seed: int | None = None) -> Path:
    return seed_dir(output_dir, spec.slug, seed)


def tokenizer_dir(options: CompareOptions) -> Path:
    return Path(options.data["tokenizer"]) if options.data.get("tokenizer") else options.output_dir / "tokenizer"


def run_options(options: CompareOptions, spec: RunSpec, seed: int) -> PretrainOptions:
    data = {**options.data, "tokenizer": str(tokenizer_dir(options).resolve())}
    return PretrainOptions(recipe=run_recipe(options, spec, seed), output_dir=run_dir(options.output_dir, spec, seed),
                           precision=options.precision, log_every=options.log_every, **data)


def say(message: str) -> None:
    say_as("compare", message)


# ---------------------------------------------------------------------------------- run states
def is_finished(path: Path) -> bool:
    """A run is finished once its final model and metrics are written (pretrain saves the model last)."""
    return (path / "model.safetensors").is_file() and (path / METRICS_FILE).is_file()


def check_same_settings(options: PretrainOptions) -> None:
    """An existing run directory must come from the same settings (budget included), or the comparison is off."""
    check_same_options(options.output_dir / OPTIONS_FILE, options.to_json(), BOOKKEEPING_OPTIONS,
                       f"{options.output_dir} was trained with other settings ({{details}}); use another "
                       "--output-dir, or delete that run directory to train it again")


# ---------------------------------------------------------------------------------- tokenizer
def shared_tokenizer(options: CompareOptions, seq_len: int) -> Path:
    """The tokenizer of every run: --tokenizer, or one trained once on the train text and saved in the output
    (with a record of what it was trained for, checked when the comparison continues)."""
    from convattn.data.corpus import load_corpus
    from convattn.data.tokenizer import trained_tokenizer

    directory = tokenizer_dir(options)
    if options.data.get("tokenizer"):
        return directory
    data = options.data
    wanted = {"vocab_size": run_recipe(options, options.grid.runs[0], 0).vocab_size,
              **{key: data[key] for key in ("dataset", "dataset_config", "train_files")}}
    wanted = json.loads(json.dumps(wanted, default=str))
    record = directory / TOKENIZER_RECORD
    if record.is_file():
        trained_for = json.loads(record.read_text())
        if trained_for != wanted:
            raise UsageError(f"{directory} was trained for other text or vocabulary ({json.dumps(trained_for)}); "
                             "use another --output-dir, or delete that directory")
        return directory
    say(f"training the shared tokenizer (unigram, {wanted['vocab_size']:,} pieces) -> {directory}")
    corpus = load_corpus(data["dataset"], data["dataset_config"], data["train_files"], data["eval_files"],
                         data["cache_dir"])
    tokenizer = trained_tokenizer(corpus.train, corpus.identity, wanted["vocab_size"], seq_len, data["cache_dir"])
    tmp = directory.with_name(directory.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tokenizer.save_pretrained(str(tmp))
    (tmp / TOKENIZER_RECORD).write_text(json.dumps(wanted, indent=2) + "\n")
    tmp.replace(directory)
    return directory


# ---------------------------------------------------------------------------------- memory
def training_memory(recipe: Recipe, tokenizer) -> dict:
    """Training memory of one model, measured the same way on any device (so models compare):

    * state: fp32 weights, gradients and the two AdamW moments, 16 bytes per parameter;
    * activations: the bytes of the tensors autograd saves for backward during the forward pass of one
      training micro-batch (per-device batch x seq_len, random tokens, 15% masked), counted once per storage
      and without the parameters, captured with saved-tensor hooks.

    Allocator overhead and short-lived buffers are left out: a lower bound that ranks models.
    """
    model = build_model(recipe, tokenizer).train()
    config = model.config
    seq_len = sequence_length(recipe, config)
    batch = per_device_batch(recipe)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(config.vocab_size, (batch, seq_len), generator=generator)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
              "token_type_ids": torch.zeros_like(input_ids)}
    if recipe.objective == "mlm":
        masked = torch.rand(input_ids.shape, generator=generator) < recipe.mlm_probability
        inputs["labels"] = input_ids.masked_fill(~masked, -100)
    parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    activations = saved_activation_bytes(lambda: model(**inputs), exclude_storages=parameter_storages)
    parameters = model.num_parameters()
    state = 16 * parameters
    return {"parameters": parameters, "encoder_parameters": model.convattn.num_parameters(),
            "micro_batch": [batch, seq_len], "state_bytes": state, "activation_bytes": activations,
            "total_bytes": state + activations}


def memory_recipe_key(recipe: Recipe) -> dict:
    """What the memory measurement depends on (everything but the seed)."""
    return {k: v for k, v in dataclasses.asdict(recipe).items() if k != "seed"}


def update_memory(options: CompareOptions, spec: RunSpec, tokenizer, cuda_peaks: dict[int, int]) -> None:
    """Write runs/<run>/memory.json: the estimate (once per recipe) and CUDA peaks of seeds trained here."""
    path = run_dir(options.output_dir, spec) / MEMORY_FILE
    recipe = run_recipe(options, spec, 0)
    record = read_json(path) or {}
    if record.get("recipe") != json.loads(json.dumps(memory_recipe_key(recipe))):
        say(f"{spec.name}: measuring training memory")
        record = {"recipe": memory_recipe_key(recipe), "estimate": training_memory(recipe, tokenizer),
                  "cuda_peak_bytes": {}}
    record["cuda_peak_bytes"].update({str(seed): peak for seed, peak in cuda_peaks.items()})
    write_json_atomic(path, record)


# ---------------------------------------------------------------------------------- running
@dataclass
class CompareOutcome:
    trained: int  # runs trained (or resumed) by this invocation
    reused: int  # finished runs found and reused
    interrupted: bool = False


def validate(options: CompareOptions) -> int:
    """Check every run's options and existing directories before anything is written; returns the longest
    sequence length (the tokenizer's maximum)."""
    check_runs(options.grid.runs)
    if options.seeds < 1:
        raise UsageError(f"--seeds {options.seeds} must be at least 1")
    seq_len = 0
    for spec in options.grid.runs:
        for seed in range(options.seeds):
            pretrain_options = run_options(options, spec, seed)
            config = check_options(pretrain_options)
            seq_len = max(seq_len, sequence_length(pretrain_options.recipe, config))
            check_same_settings(pretrain_options)
    if options.glue:
        from convattn.data.glue import get_task
        from convattn.training.glue import check_data

        check_data([get_task(name) for name in options.glue.tasks], options.glue.data_dir)
    if options.squad:
        from convattn.data.squad import read_squad_json

        for file in (options.squad.train_file, options.squad.dev_file):
            if file is not None:
                read_squad_json(file)  # missing, empty or not JSON: said before any training
    return seq_len


def train_one(pretrain_options: PretrainOptions) -> tuple[bool, int | None]:
    """Train, resume or restart one run; returns (interrupted, CUDA peak bytes or None)."""
    path = pretrain_options.output_dir
    pretrain_options.resume = bool(complete_checkpoints(path / "checkpoints"))
    pretrain_options.overwrite = not pretrain_options.resume and path.exists()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    summary = pretrain(pretrain_options)
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    return summary.interrupted, peak


def run_compare(options: CompareOptions) -> CompareOutcome:
    """Train (or reuse) every run and seed and fine-tune on GLUE if asked (`write_report` then reports)."""
    from convattn.data.tokenizer import load_tokenizer

    seq_len = validate(options)
    options.output_dir.mkdir(parents=True, exist_ok=True)
    log_to(options.output_dir)
    tokenizer = load_tokenizer(shared_tokenizer(options, seq_len))
    outcome = CompareOutcome(trained=0, reused=0)
    total = len(options.grid.runs) * options.seeds
    for index, spec in enumerate(options.grid.runs):
        cuda_peaks = {}
        for seed in range(options.seeds):
            number = index * options.seeds + seed + 1
            pretrain_options = run_options(options, spec, seed)
            if is_finished(pretrain_options.output_dir):
                say(f"[{number}/{total}] {spec.name} seed {seed}: finished earlier, reused")
                outcome.reused += 1
                continue
            state = "resuming" if complete_checkpoints(pretrain_options.output_dir / "checkpoints") else "training"
            say(f"[{number}/{total}] {spec.name} seed {seed}: {state} -> {pretrain_options.output_dir}")
            interrupted, peak = train_one(pretrain_options)
            outcome.trained += 1
            if peak is not None:
                cuda_peaks[seed] = peak
            if interrupted:
                outcome.interrupted = True
                return outcome
        update_memory(options, spec, tokenizer, cuda_peaks)
        if options.glue or options.squad:
            fine_tune_runs(options, spec)
    return outcome


def fine_tune_runs(options: CompareOptions, spec: RunSpec) -> None:
    for seed in range(options.seeds):
        path = run_dir(options.output_dir, spec, seed)
        model = path / "discriminator" if (path / "discriminator").is_dir() else path  # ELECTRA: the discriminator
        if request := options.glue:
            from convattn.training.glue import run_glue

            say(f"{spec.name} seed {seed}: GLUE {','.join(request.tasks)}")
            run_glue(str(model), request.tasks, path / "glue", data_dir=request.data_dir, recipe=request.recipe,
                     seeds=request.seeds, overrides=request.overrides)
        if request := options.squad:
            from convattn.training.squad import run_squad

            say(f"{spec.name} seed {seed}: SQuAD v{request.version}")
            run_squad(str(model), request.version, path / "squad", train_file=request.train_file,
                      dev_file=request.dev_file, seeds=request.seeds, overrides=request.overrides)
