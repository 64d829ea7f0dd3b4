"""GLUE settings: a paper's GLUE recipe (configs/recipes/glue/*.yaml, `GlueRecipe`) resolved per task."""

from __future__ import annotations

from dataclasses import dataclass, field

from convattn.errors import UsageError
from convattn.training.finetune.recipes import FineTuneRecipe, fine_tune_recipe_names, read_recipe
from convattn.training.finetune.settings import FineTuneSettings, given_overrides, resolved_settings


@dataclass(frozen=True, kw_only=True)
class GlueRecipe(FineTuneRecipe):
    tasks: dict = field(default_factory=dict)  # task -> its own settings fields, over the defaults and base-size ones
    from_mnli_tasks: list = field(default_factory=list)  # tasks that start from the same seed's MNLI-tuned model

    def task_fields(self, task: str, base_size: bool) -> dict:
        """The settings fields of `task`: defaults < base-size settings < the task's own."""
        return {**self.settings_fields(base_size), **self.tasks.get(task, {})}


@dataclass(frozen=True, kw_only=True)
class GlueSettings(FineTuneSettings):
    from_mnli: bool  # start from the same seed's MNLI-tuned model (the recipe's `from_mnli_tasks`)


def load_glue_recipe(name: str) -> GlueRecipe:
    names = fine_tune_recipe_names("glue")
    if name not in names:
        raise UsageError(f"unknown recipe {name!r}; recipes are {', '.join(names)}")
    return read_recipe("glue", name, GlueRecipe)


def resolve_settings(recipe: GlueRecipe, task: str, base_size: bool, overrides: dict, task_lr: dict[str, float],
                     from_mnli: bool) -> GlueSettings:
    """recipe defaults < base-size settings < per-task settings < command-line overrides (None: not given) <
    per-task lr."""
    fields = {**recipe.task_fields(task, base_size), **given_overrides(overrides)}
    if task in task_lr:
        fields["learning_rate"] = task_lr[task]
    fields["from_mnli"] = from_mnli and task in recipe.from_mnli_tasks
    settings = GlueSettings(**fields)
    return resolved_settings(settings)
