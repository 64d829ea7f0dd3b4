"""What a pretraining run is asked to do (`PretrainOptions`) and every check made before anything is written."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from convattn.config import ConvAttnConfig
from convattn.data.formatting import FORMATS
from convattn.data.tokenizer import check_vocab_size
from convattn.errors import UsageError
from convattn.training.recipes import Recipe, warmup_steps
from convattn.training.run_folder import BOOKKEEPING_OPTIONS, check_removable, check_same_options, check_weights

OBJECTIVES = ("mlm", "electra")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
OPTIONS_FILE = "pretrain_options.json"
METRICS_FILE = "metrics.jsonl"
# options that may change between a run and its --resume without changing what is computed
RESUMABLE_CHANGES = (*BOOKKEEPING_OPTIONS, "eval_every", "save_every", "allow_schedule_change")
# options that change the learning-rate schedule of a resumed run: only with --allow-schedule-change
SCHEDULE_CHANGES = ("max_steps",)


def default_cache_dir() -> Path:
    return Path(os.environ.get("CONVATTN_CACHE", Path.home() / ".cache" / "convattn"))


@dataclass
class PretrainOptions:
    recipe: Recipe
    output_dir: Path
    dataset: str | None = None
    dataset_config: str | None = None
    train_files: list[str] = field(default_factory=list)
    eval_files: list[str] = field(default_factory=list)
    tokenizer: str | None = None
    cache_dir: Path = field(default_factory=default_cache_dir)
    precision: str = "auto"
    log_every: int = 10
    resume: bool = False
    overwrite: bool = False
    allow_schedule_change: bool = False  # on --resume: a new max_steps (the lr schedule changes with it)

    @classmethod
    def from_json(cls, saved: dict) -> PretrainOptions:
        """The options of a run, read back from its OPTIONS_FILE (the inverse of `to_json`)."""
        recipe_fields = {f.name for f in dataclasses.fields(Recipe)}
        option_fields = {f.name for f in dataclasses.fields(cls)} - {"recipe"}
        fields = {k: v for k, v in saved.items() if k in option_fields}
        fields["output_dir"], fields["cache_dir"] = Path(fields["output_dir"]), Path(fields["cache_dir"])
        return cls(recipe=Recipe(**{k: v for k, v in saved.items() if k in recipe_fields}), **fields)

    def to_json(self) -> dict:
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "recipe"}
        fields.update(dataclasses.asdict(self.recipe))
        return json.loads(json.dumps(fields, default=str))

def check_options(options: PretrainOptions) -> ConvAttnConfig:
    """Validate what can be validated before reading the corpus; returns the model config (recipe vocab)."""
    recipe = options.recipe
    if recipe.objective not in OBJECTIVES:
        raise UsageError(f"--objective {recipe.objective!r} is not known; choose one of {', '.join(OBJECTIVES)}")
    if recipe.format not in FORMATS:
        raise UsageError(f"--format {recipe.format!r} is not known; choose one of {', '.join(FORMATS)}")
    if options.precision not in PRECISIONS:
        raise UsageError(f"--precision {options.precision!r} is not known; choose one of {', '.join(PRECISIONS)}")
    for flag, value in (("--batch-size", recipe.batch_size), ("--max-steps", recipe.max_steps),
                        ("--eval-every", recipe.eval_every), ("--save-every", recipe.save_every),
                        ("--gradient-accumulation", recipe.gradient_accumulation), ("--log-every", options.log_every)):
        if value < 1:
            raise UsageError(f"{flag} {value} must be at least 1")
    if not 0 < recipe.mlm_probability < 1:
        raise UsageError(f"--mlm-probability {recipe.mlm_probability} must be between 0 and 1")
    if warmup_steps(recipe) >= recipe.max_steps:
        raise UsageError(f"--warmup {recipe.warmup:g} is not below --max-steps {recipe.max_steps}: the learning rate "
                         "would never reach its peak; lower --warmup (or give a fraction of the run, e.g. 0.06)")
    if recipe.learning_rate <= 0:
        raise UsageError(f"--lr {recipe.learning_rate} must be positive")
    if options.tokenizer is None:
        check_vocab_size(recipe.vocab_size)
    config = ConvAttnConfig.from_preset(recipe.preset, **recipe.model)
    seq_len = recipe.seq_len or config.max_position_embeddings
    if seq_len > config.max_position_embeddings:
        raise UsageError(
            f"--seq-len {seq_len} is above the model's maximum of {config.max_position_embeddings} positions "
            f"(preset {recipe.preset}); lower --seq-len or raise --max-len"
        )
    if seq_len < 8:
        raise UsageError(f"--seq-len {seq_len} is too short; use at least 8 tokens (the papers use 128)")
    return config


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def per_device_batch(recipe: Recipe) -> int:
    processes = world_size() * recipe.gradient_accumulation
    if recipe.batch_size % processes:
        raise UsageError(
            f"--batch-size {recipe.batch_size} must divide evenly over {world_size()} process(es) x "
            f"{recipe.gradient_accumulation} accumulation step(s); change --batch-size or --gradient-accumulation"
        )
    return recipe.batch_size // processes


def complete_checkpoints(directory: Path) -> list[Path]:
    """Checkpoints whose trainer state was written (Trainer writes it last), oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.glob("checkpoint-*")
             if p.name.removeprefix("checkpoint-").isdigit() and (p / "trainer_state.json").exists()]
    return sorted(found, key=lambda p: int(p.name.removeprefix("checkpoint-")))


def check_output_dir(options: PretrainOptions) -> Path | None:
    """The checkpoint to resume from (None for a fresh run); raises if the directory is in the way."""
    out = options.output_dir
    if options.resume:
        checkpoints = complete_checkpoints(out / "checkpoints")
        if not checkpoints:
            raise UsageError(f"--resume: {out} has no complete checkpoint to resume from; drop --resume to start")
        allowed = RESUMABLE_CHANGES + (SCHEDULE_CHANGES if options.allow_schedule_change else ())
        check_same_options(out / OPTIONS_FILE, options.to_json(), allowed,
                           f"--resume: options differ from the run in {out} ({{details}}); drop those flags (the run's "
                           "own options are read from it), or add --allow-schedule-change to change --max-steps")
        check_weights(checkpoints[-1])
        return checkpoints[-1]
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output-dir {out} is a file; choose a directory")
    if options.overwrite and out.is_dir():
        check_removable(out, OPTIONS_FILE)
    if out.is_dir() and any(out.iterdir()) and not options.overwrite:
        raise UsageError(
            f"--output-dir {out} is not empty; continue that run with --resume, replace it with --overwrite, "
            "or choose another --output-dir"
        )
    return None
