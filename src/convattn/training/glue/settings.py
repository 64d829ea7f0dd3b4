"""GLUE settings: a paper's GLUE recipe (configs/recipes/glue/*.yaml) resolved per task."""

from __future__ import annotations

from dataclasses import dataclass

from convattn import configs
from convattn.errors import UsageError
from convattn.training.finetune.settings import FineTuneSettings, check_warmup, resolved_fields
from convattn.training.recipes import glue_recipe_names

RECIPE_KEYS = ("seeds", "defaults", "base_size", "tasks", "from_mnli_tasks")


@dataclass(frozen=True, kw_only=True)
class GlueSettings(FineTuneSettings):
    from_mnli: bool  # start from the same seed's MNLI-tuned model (the recipe's `from_mnli_tasks`)


def load_glue_recipe(name: str) -> dict:
    if name not in glue_recipe_names():
        raise UsageError(f"unknown recipe {name!r}; recipes are {', '.join(glue_recipe_names())}")
    return configs.load("recipes", "glue", name, allowed=RECIPE_KEYS)


def resolve_settings(recipe: dict, task: str, base_size: bool, overrides: dict, task_lr: dict[str, float],
                     from_mnli: bool) -> GlueSettings:
    """recipe defaults < base-size settings < per-task settings < command-line overrides < per-task lr."""
    fields = resolved_fields(recipe, base_size, overrides, recipe.get("tasks", {}).get(task, {}))
    if task in task_lr:
        fields["learning_rate"] = task_lr[task]
    fields["from_mnli"] = from_mnli and task in recipe.get("from_mnli_tasks", ())
    settings = GlueSettings(**fields)
    check_warmup(settings)
    return settings
