"""Fine-tuning settings: a SQuAD recipe (configs/recipes/squad/*.yaml) with command-line overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import resources

import yaml

from convattn.console import say
from convattn.errors import UsageError
from convattn.training.recipes import squad_recipe_names

BASE_HIDDEN_SIZE = 768  # models this wide get the recipe's `base_size` settings


@dataclass(frozen=True)
class SquadSettings:
    learning_rate: float
    batch_size: int
    epochs: float
    warmup_ratio: float
    weight_decay: float
    layer_decay: float
    adam_epsilon: float
    max_length: int
    doc_stride: int
    max_query_length: int
    n_best: int
    max_answer_length: int
    head: str = "span"             # "joint": ELECTRA's head (convattn models only; qa.py)
    max_steps: int = 0             # > 0 overrides epochs
    max_train_samples: int = 0     # 0 = every training question


def load_squad_recipe(name: str) -> dict:
    if name not in squad_recipe_names():
        raise UsageError(f"unknown --recipe {name!r}; SQuAD recipes are {', '.join(squad_recipe_names())}")
    return yaml.safe_load(resources.files("convattn.configs").joinpath("recipes", "squad", f"{name}.yaml").read_text())


def resolve_settings(recipe: dict, base_size: bool, overrides: dict) -> SquadSettings:
    """recipe defaults < base-size settings < command-line overrides (None = not given)."""
    fields = dict(recipe["defaults"])
    if base_size:
        fields.update(recipe.get("base_size", {}))
    fields.update({k: v for k, v in overrides.items() if v is not None})
    settings = SquadSettings(**fields)
    if not 0 <= settings.warmup_ratio < 1:
        raise UsageError(f"--warmup-ratio {settings.warmup_ratio} must be a fraction in [0, 1)")
    return settings


def fitted_windows(settings: SquadSettings, special_tokens: int, doc_stride_given: bool) -> SquadSettings:
    """The settings with window lengths that agree: a window (--max-length less the question and the special
    tokens) holds some context, and each window starts within the previous one (--doc-stride at most the context a
    window holds). A --doc-stride given on the command line that does not fit is refused; the recipe's is lowered
    (and said)."""
    context = settings.max_length - settings.max_query_length - special_tokens
    if context < 1:
        raise UsageError(f"--max-length {settings.max_length} leaves no room for a context after --max-query-length "
                         f"{settings.max_query_length} and {special_tokens} special tokens; give --max-length "
                         f"{settings.max_query_length + special_tokens + 1} or more")
    if settings.doc_stride <= context:
        return settings
    holds = (f"the {context} context tokens a window holds (--max-length {settings.max_length} less "
             f"--max-query-length {settings.max_query_length} and {special_tokens} special tokens)")
    if doc_stride_given:
        raise UsageError(f"--doc-stride {settings.doc_stride} must be at most {context}: each window starts within "
                         f"the previous one, and {holds}")
    say("squad", f"the recipe's doc stride {settings.doc_stride} exceeds {holds}; using {context}")
    return dataclasses.replace(settings, doc_stride=context)
