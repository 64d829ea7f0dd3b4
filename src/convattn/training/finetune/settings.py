"""The settings every fine-tuning task shares, and how a task's recipe (configs/recipes/<task>/*.yaml) resolves
them: recipe defaults < base-size settings < the task's own < overrides (the command line)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from convattn.errors import UsageError, option

BASE_HIDDEN_SIZE = 768  # models this wide get the recipe's `base_size` settings


@dataclass(frozen=True, kw_only=True)
class FineTuneSettings:
    """What the Trainer of any task needs; a task's settings class adds its own fields."""

    learning_rate: float
    batch_size: int
    epochs: float
    max_steps: int = 0             # > 0 overrides epochs
    warmup_ratio: float
    weight_decay: float
    layer_decay: float
    adam_epsilon: float
    max_length: int
    max_train_samples: int = 0     # 0 = the whole training set


def resolved_fields(recipe: dict, base_size: bool, overrides: dict, task_fields: dict | None = None) -> dict:
    """The recipe's defaults, its base-size settings (for models at least BASE_HIDDEN_SIZE wide), the task's own
    fields, then the overrides that were given (None = not given)."""
    fields = dict(recipe["defaults"])
    if base_size:
        fields.update(recipe.get("base_size", {}))
    fields.update(task_fields or {})
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return fields


def check_warmup(settings: FineTuneSettings) -> None:
    ratio = settings.warmup_ratio
    if not (isinstance(ratio, int | float) and math.isfinite(ratio) and 0 <= ratio < 1):
        raise UsageError(f"{option('warmup_ratio')} {ratio} must be a fraction in [0, 1)")
