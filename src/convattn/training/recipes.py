"""Pretraining recipes: the papers' protocols as named, overridable settings.

A recipe is a YAML file in `convattn/configs/recipes/pretrain/`; its keys are `Recipe` fields and
any field left out takes the default below (the settings all three papers share: AdamW with
eps 1e-6 and weight decay 0.01, linear warmup then linear decay, gradient clipping at 1.0).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from convattn import configs
from convattn.errors import UsageError, option

QUICK_RECIPE = "default"  # `convattn pretrain`'s own quick run, sized for minutes: a shorter run keeps its settings


@dataclass
class Recipe:
    preset: str
    objective: str = "mlm"  # "mlm" or "electra"
    format: str = "pairs"  # "pairs" or "packed"
    model: dict = field(default_factory=dict)  # config-field overrides of the preset
    vocab_size: int = 30004
    seq_len: int | None = None  # None: the model's max_position_embeddings
    batch_size: int = 128  # per optimizer step, over all processes and accumulation steps
    gradient_accumulation: int = 1
    learning_rate: float = 3e-4
    weight_decay: float = 0.01
    adam_epsilon: float = 1e-6
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    warmup: float = 10000  # steps, or a fraction of max_steps when below 1
    max_steps: int | None = 125000  # None: no step limit (a time-budget run, which its clock ends)
    time_budget: float | None = None  # seconds of training: the schedule follows the clock (pretrain/budget.py)
    budget_clock: str = "compute"  # what the time budget counts: compute or wall (pretrain/budget.py's CLOCKS)
    max_grad_norm: float = 1.0
    mlm_probability: float = 0.15
    eval_every: int = 5000
    save_every: int = 5000
    eval_samples: int | None = None  # evaluate on the first N eval examples (None: all)
    seed: int = 42


def recipe_names() -> list[str]:
    return configs.names("recipes", "pretrain")


def load_recipe(name: str) -> Recipe:
    if name not in recipe_names():
        raise UsageError(f"unknown recipe {name!r}; choose {option('recipe')} from {', '.join(recipe_names())}")
    return Recipe(**configs.load("recipes", "pretrain", name, allowed=[f.name for f in dataclasses.fields(Recipe)]))


def recipe_for_preset(preset: str | None) -> str:
    """The recipe a preset's paper used (`default` when no preset is named)."""
    if preset is None:
        return "default"
    family, _, row = preset.partition("/")
    if family == "convbert":
        return "convbert-base" if row.startswith("base") else "convbert-small"
    if family in ("chang2021-small", "chang2021-base", "malard"):
        return family
    return "default"


def resolve_recipe(preset: str | None, recipe: str | None = None, model: dict | None = None,
                   training: dict | None = None, paper_of: str | None = None) -> tuple[Recipe, str | None]:
    """The recipe of one run, and a one-line note of what applies unasked (the recipe's values, its warmup and grid
    fitted to the run's length), or None: the recipe file `recipe` (default: the paper of `paper_of`, else of
    `preset`), for `preset`, with config fields `model` and recipe fields `training` on top.
    The default recipe's model size belongs to its own preset: another preset keeps its size."""
    name = recipe or recipe_for_preset(paper_of or preset)
    paper, given = load_recipe(name), training or {}
    sized = paper.model if not preset or recipe is not None or name != "default" else {}
    resolved = dataclasses.replace(paper, preset=preset or paper.preset, model={**sized, **(model or {})})
    resolved, note = apply_overrides(resolved, given)
    grids = None
    if name != QUICK_RECIPE:
        resolved, grids = shortened_grids(paper, resolved, given)
    if resolved.time_budget is not None and "max_steps" not in given:
        resolved, note = budget_schedule(resolved, given_warmup="warmup" in given)
    values = recipe_values(name, resolved, given) if name != QUICK_RECIPE else None
    return resolved, "; ".join(line for line in (values, note, grids) if line) or None


def recipe_values(name: str, recipe: Recipe, given: dict) -> str | None:
    """For a run whose length the user chose (--max-steps, --time-budget): the recipe's values that set the time a
    step takes and still apply, nothing on the command line having replaced them; None otherwise."""
    if "max_steps" not in given and "time_budget" not in given:
        return None
    values = {"batch_size": ("--batch-size", f"batch {recipe.batch_size:,}"),
              "vocab_size": ("--vocab-size", f"vocabulary {recipe.vocab_size:,}"),
              "seq_len": ("--seq-len", f"sequence length {recipe.seq_len:,}" if recipe.seq_len else None)}
    kept = [(flag, text) for field_name, (flag, text) in values.items() if text and field_name not in given]
    if not kept:
        return None
    return (f"recipe {name}: {', '.join(text for _, text in kept)} "
            f"(give {', '.join(flag for flag, _ in kept)} to change)")


SHORT_RUN_POINTS = 10  # a shortened run evaluates, and saves, up to this many times where the recipe's share is more


def shortened_grids(paper: Recipe, recipe: Recipe, given: dict) -> tuple[Recipe, str | None]:
    """A run shorter than its recipe's evaluates and saves on the recipe's grid scaled to the run's length, but no
    more often than SHORT_RUN_POINTS times a run unless the recipe's own grid is finer (5,000 of 125,000 steps ->
    every 30 of 300, not 12; 10,000 of 1M -> every 10,000 of 200k); returns a note saying so, or None. A grid given
    on the command line is kept, as is a time budget's (the clock's)."""
    if recipe.time_budget is not None or recipe.max_steps >= paper.max_steps:
        return recipe, None
    grid, scaled = {}, []
    for field_name, label in (("eval_every", "evaluation"), ("save_every", "checkpoint")):
        if field_name not in given:
            every = getattr(paper, field_name)
            share = round(every * recipe.max_steps / paper.max_steps)
            grid[field_name] = max(share, min(every, math.ceil(recipe.max_steps / SHORT_RUN_POINTS)), 1)
            scaled.append(f"{label} every {grid[field_name]:,}")
    if not scaled:
        return recipe, None
    paper_grid = " and ".join(dict.fromkeys(f"{every:,}" for every in (paper.eval_every, paper.save_every)))
    return dataclasses.replace(recipe, **grid), (
        f"{' and '.join(scaled)} steps for --max-steps {recipe.max_steps:,} (the recipe's every {paper_grid} of "
        f"{paper.max_steps:,} steps; give --eval-every / --save-every to choose)")


def budget_schedule(recipe: Recipe, given_warmup: bool) -> tuple[Recipe, str | None]:
    """A time budget without --max-steps: only the clock ends the run (no step limit), and a recipe's warmup in
    steps becomes the same share of the budget (e.g. 10k of 125k steps -> 8%); returns the recipe and a note saying
    so, or None."""
    if recipe.warmup < 1 or given_warmup:
        return dataclasses.replace(recipe, max_steps=None), None
    share = recipe.warmup / recipe.max_steps
    note = (f"warmup: the recipe's {recipe.warmup:,g} of {recipe.max_steps:,} steps, as the same share "
            f"({share:.1%}) of the time budget (give --warmup to choose)")
    return dataclasses.replace(recipe, warmup=share, max_steps=None), note


def apply_overrides(recipe: Recipe, fields: dict) -> tuple[Recipe, str | None]:
    """`recipe` with fields from the command line. A paper's warmup in steps keeps its share of the run when
    --max-steps changes (e.g. 10k of 125k steps -> 24 of 300), unless warmup is itself given; returns the recipe
    and a note saying so, or None."""
    given = dataclasses.replace(recipe, **fields)
    if "warmup" in fields or recipe.warmup < 1 or given.max_steps == recipe.max_steps:
        return given, None
    scaled = dataclasses.replace(given, warmup=round(recipe.warmup * given.max_steps / recipe.max_steps))
    return scaled, (f"warmup scaled to {scaled.warmup:,} steps: the recipe's {recipe.warmup:,g} of "
                    f"{recipe.max_steps:,} steps, as the same share of --max-steps {scaled.max_steps:,} (give --warmup "
                    "to choose)")


def warmup_steps(recipe: Recipe) -> int:
    """Warmup in steps (a warmup below 1 is a fraction of max_steps)."""
    return round(recipe.warmup * recipe.max_steps) if recipe.warmup < 1 else int(recipe.warmup)
