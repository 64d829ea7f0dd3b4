"""What a comparison is asked to do (`CompareOptions`, with its GLUE and SQuAD requests), each run's pretraining
options (recipe file < grid < the run's own fields < command line)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from convattn.console import say
from convattn.runs.folder import BOOKKEEPING_OPTIONS, check_same_options, seed_dir
from convattn.runs.pretrain import OPTIONS_FILE, recorded_options
from convattn.training.compare.grids import Grid, RunSpec
from convattn.training.pretrain import PretrainOptions
from convattn.training.recipes import Recipe, recipe_for_preset, resolve_recipe

MEMORY_FILE = "memory.json"


@dataclass
class GlueOptions:
    """Fine-tune each final model on GLUE tasks (`convattn glue` machinery) and report the dev scores."""

    tasks: list[str]
    data_dir: Path | None = None
    recipe: str = "chang2021"
    seeds: int = 1
    overrides: dict = field(default_factory=dict)  # FineTuneSettings fields, e.g. max_steps, max_train_samples


@dataclass
class SquadOptions:
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
    compile: str | None = None  # torch.compile's mode (None: eager)
    log_every: int = 10
    glue: GlueOptions | None = None
    squad: SquadOptions | None = None

    @property
    def recipe_name(self) -> str:
        return self.recipe or self.grid.recipe or recipe_for_preset(self.grid.runs[0].preset)

    def run_path(self, spec: RunSpec, seed: int | None = None) -> Path:
        """`runs/<run>/seed<k>` of this comparison (the run's own folder when seed is None)."""
        return seed_dir(self.output_dir, spec.slug, seed)


def run_recipe(options: CompareOptions, spec: RunSpec, seed: int) -> Recipe:
    """The recipe of one run: recipe file < grid < the run's own fields < command line; the seed is the run's."""
    return dataclasses.replace(recipe_and_note(options, spec)[0], seed=seed)


def recipe_and_note(options: CompareOptions, spec: RunSpec) -> tuple[Recipe, str | None]:
    """A run's recipe and the note of what it applies unasked (`resolve_recipe`)."""
    return resolve_recipe(spec.preset, options.recipe or options.grid.recipe,
                          model={**options.grid.model, **spec.model, **options.model},
                          training={**options.grid.training, **options.training},
                          paper_of=options.grid.runs[0].preset)


def say_recipe_notes(options: CompareOptions) -> None:
    """Each run's recipe note, once (the recipe is resolved again for every seed, report and measurement); a note
    that every run shares is one line."""
    notes = {spec.name: recipe_and_note(options, spec)[1] for spec in options.grid.runs}
    if len(notes) > 1 and len(set(notes.values())) == 1:
        notes = {"every run": next(iter(notes.values()))}
    for name, note in notes.items():
        if note:
            say("compare", f"{name}: {note}")


def tokenizer_dir(options: CompareOptions) -> Path:
    return Path(options.data["tokenizer"]) if options.data.get("tokenizer") else options.output_dir / "tokenizer"


def run_options(options: CompareOptions, spec: RunSpec, seed: int, resume: bool = False,
                overwrite: bool = False) -> PretrainOptions:
    data = {**options.data, "tokenizer": str(tokenizer_dir(options).resolve())}
    return PretrainOptions(recipe=run_recipe(options, spec, seed), output_dir=options.run_path(spec, seed),
                           precision=options.precision, compile=options.compile, log_every=options.log_every,
                           resume=resume, overwrite=overwrite, **data)


def check_same_settings(options: PretrainOptions) -> None:
    """An existing run directory must come from the same settings (budget included), or the comparison is off."""
    check_same_options(recorded_options(options.output_dir / OPTIONS_FILE), options.to_json(),
                       (*BOOKKEEPING_OPTIONS, "compile", "compile_difference", "allow_eval_overlap"),
                       f"{options.output_dir} was trained with other settings ({{details}}); use another "
                       "--output-dir, or delete that run directory to train it again")
