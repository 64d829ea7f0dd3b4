"""Fine-tuning settings: a paper's GLUE recipe (configs/recipes/glue/*.yaml) resolved per task."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import yaml

from convattn.errors import UsageError
from convattn.training.recipes import glue_recipe_names

BASE_HIDDEN_SIZE = 768  # models this wide get the recipe's `base_size` settings (lr 1e-4)


@dataclass(frozen=True)
class FineTuneSettings:
    learning_rate: float
    batch_size: int
    epochs: float
    max_steps: int             # > 0 overrides epochs
    warmup_ratio: float
    weight_decay: float
    layer_decay: float
    adam_epsilon: float
    max_length: int
    max_train_samples: int     # 0 = the whole training set
    from_mnli: bool


OVERRIDABLE = ("learning_rate", "batch_size", "epochs", "max_steps", "warmup_ratio", "weight_decay", "layer_decay",
               "max_length", "max_train_samples")


def load_glue_recipe(name: str) -> dict:
    if name not in glue_recipe_names():
        raise UsageError(f"unknown recipe {name!r}; recipes are {', '.join(glue_recipe_names())}")
    text = resources.files("convattn.configs").joinpath("recipes", "glue", f"{name}.yaml").read_text()
    return yaml.safe_load(text)


def resolve_settings(recipe: dict, task: str, base_size: bool, overrides: dict, task_lr: dict[str, float],
                     from_mnli: bool) -> FineTuneSettings:
    """recipe defaults < base-size settings < per-task settings < command-line overrides < per-task lr."""
    fields = {"max_steps": 0, "max_train_samples": 0, **recipe["defaults"]}
    if base_size:
        fields.update(recipe.get("base_size", {}))
    fields.update(recipe.get("tasks", {}).get(task, {}))
    fields.update({k: v for k, v in overrides.items() if v is not None})
    if task in task_lr:
        fields["learning_rate"] = task_lr[task]
    fields["from_mnli"] = from_mnli and task in recipe.get("from_mnli_tasks", ())
    settings = FineTuneSettings(**fields)
    if not 0 <= settings.warmup_ratio < 1:
        raise UsageError(f"warmup ratio must be in [0, 1), got {settings.warmup_ratio}")
    return settings
