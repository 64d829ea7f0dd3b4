"""Fine-tuning recipes: a paper's hyperparameters for a task, one YAML file each in
`convattn/configs/recipes/<task>/` (task: glue, squad), typed as pretraining's `Recipe` is: a key the task's recipe
class does not have is refused. The names are listed here, without importing a task's package (the command line's
choices)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TypeVar

from convattn import configs

BASE_HIDDEN_SIZE = 768  # models this wide get the recipe's `base_size` settings


@dataclass(frozen=True, kw_only=True)
class FineTuneRecipe:
    """What every task's recipe holds (a SQuAD recipe holds only this; `GlueRecipe` adds per-task settings)."""

    seeds: int  # fine-tuning runs, seeds 0..N-1
    defaults: dict  # fields of the task's settings class (`FineTuneSettings` and the task's own)
    base_size: dict = field(default_factory=dict)  # over the defaults, for models at least BASE_HIDDEN_SIZE wide

    def settings_fields(self, base_size: bool) -> dict:
        """The defaults, then the base-size settings for a model at least BASE_HIDDEN_SIZE wide."""
        return {**self.defaults, **(self.base_size if base_size else {})}


AnyRecipe = TypeVar("AnyRecipe", bound=FineTuneRecipe)


def fine_tune_recipe_names(task: str) -> list[str]:
    """The recipes shipped for `task` (glue, squad)."""
    return configs.names("recipes", task)


def read_recipe(task: str, name: str, recipe_class: type[AnyRecipe]) -> AnyRecipe:
    """The shipped recipe `name` of `task`; a key that `recipe_class` has no field for is refused."""
    allowed = [f.name for f in dataclasses.fields(recipe_class)]
    return recipe_class(**configs.load("recipes", task, name, allowed=allowed))
