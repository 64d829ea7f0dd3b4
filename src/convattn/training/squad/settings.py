"""SQuAD settings: a SQuAD recipe (configs/recipes/squad/*.yaml, a `FineTuneRecipe`: no keys of its own) with
command-line overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from convattn.console import say
from convattn.errors import UsageError, option
from convattn.training.finetune.recipes import FineTuneRecipe, fine_tune_recipe_names, read_recipe
from convattn.training.finetune.settings import FineTuneSettings, given_overrides, resolved_settings


@dataclass(frozen=True, kw_only=True)
class SquadSettings(FineTuneSettings):
    doc_stride: int
    max_query_length: int
    n_best: int
    max_answer_length: int
    head: str = "span"             # "joint": ELECTRA's head (convattn models only; qa.py)


def load_squad_recipe(name: str) -> FineTuneRecipe:
    names = fine_tune_recipe_names("squad")
    if name not in names:
        raise UsageError(f"unknown {option('recipe')} {name!r}; SQuAD recipes are {', '.join(names)}")
    return read_recipe("squad", name, FineTuneRecipe)


def resolve_settings(recipe: FineTuneRecipe, base_size: bool, overrides: dict) -> SquadSettings:
    """recipe defaults < base-size settings < command-line overrides (None = not given)."""
    settings = SquadSettings(**{**recipe.settings_fields(base_size), **given_overrides(overrides)})
    return resolved_settings(settings)


def fitted_windows(settings: SquadSettings, special_tokens: int, doc_stride_given: bool) -> SquadSettings:
    """The settings with window lengths that agree: a window (--max-length less the question and the special
    tokens) holds some context, and each window starts within the previous one (--doc-stride at most the context a
    window holds). A --doc-stride given on the command line that does not fit is refused; the recipe's is lowered
    (and said)."""
    context = settings.max_length - settings.max_query_length - special_tokens
    if context < 1:
        raise UsageError(f"{option('max_length')} {settings.max_length} leaves no room for a context after "
                         f"{option('max_query_length')} "
                         f"{settings.max_query_length} and {special_tokens} special tokens; give "
                         f"{option('max_length')} "
                         f"{settings.max_query_length + special_tokens + 1} or more")
    if settings.doc_stride <= context:
        return settings
    holds = (f"the {context} context tokens a window holds (--max-length {settings.max_length} less "
             f"--max-query-length {settings.max_query_length} and {special_tokens} special tokens)")
    if doc_stride_given:
        raise UsageError(f"{option('doc_stride')} {settings.doc_stride} must be at most {context}: each window "
                         f"starts within the previous one, and {holds}")
    say("squad", f"the recipe's doc stride {settings.doc_stride} exceeds {holds}; using {context}")
    return dataclasses.replace(settings, doc_stride=context)
