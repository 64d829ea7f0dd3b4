"""From what a user asks for to a run's `PretrainOptions`: a new run resolves its recipe (`resolve_recipe`); a
resumed run reads its own options back and takes only what is given now on top (the run then checks what
changed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from convattn.console import say
from convattn.errors import UsageError, option
from convattn.runs.pretrain import PRETRAIN, recorded_options
from convattn.runs.replace import replaced_record
from convattn.training.pretrain.options import PretrainOptions
from convattn.training.recipes import recipe_for_preset, resolve_recipe


def resolve_options(output_dir: Path | None = None, preset: str | None = None, recipe: str | None = None,
                    model: dict | None = None, training: dict | None = None, data: dict | None = None,
                    precision: str | None = None, compile: str | None = None, log_every: int | None = None,
                    resume: bool = False, overwrite: bool = False,
                    allow_schedule_change: bool = False) -> PretrainOptions:
    """The options of a pretraining run. `model`: config fields over the preset's; `training`: Recipe fields over
    the recipe's; `data`: the PretrainOptions data fields given (None or empty: not given). The output folder
    defaults to runs/pretrain-<recipe>."""
    data = {name: value for name, value in (data or {}).items() if value}
    check_vocabulary_source(training, data.get("tokenizer"))
    if resume and output_dir is not None and replaced_record(output_dir, PRETRAIN).is_file():
        saved = saved_options(replaced_record(output_dir, PRETRAIN))
        recipe_fields = {"preset": preset} if preset else {}
        recipe_fields |= {"model": {**saved.recipe.model, **(model or {})}, **(training or {})}
        data = {name: Path(value) if name == "cache_dir" else value for name, value in data.items()}
        return dataclasses.replace(
            saved, recipe=dataclasses.replace(saved.recipe, **recipe_fields), **data,
            precision=saved.precision if precision in (None, "auto") else precision, compile=compile or saved.compile,
            output_dir=output_dir, resume=True, overwrite=overwrite, allow_schedule_change=allow_schedule_change)
    resolved, note = resolve_recipe(preset, recipe, model, training)
    if note:
        say("pretrain", note)
    extra = {"log_every": log_every} if log_every is not None else {}
    return PretrainOptions(
        recipe=resolved, output_dir=output_dir or Path("runs") / f"pretrain-{recipe or recipe_for_preset(preset)}",
        **data, precision=precision or "auto", compile=compile, resume=resume, overwrite=overwrite,
        allow_schedule_change=allow_schedule_change, **extra,
    )


def check_vocabulary_source(training: dict | None, tokenizer: str | None) -> None:
    """--vocab-size sizes a tokenizer to train; with --tokenizer none is trained, so it would be ignored."""
    if tokenizer and (training or {}).get("vocab_size") is not None:
        raise UsageError(f"{option('vocab_size')} sizes a tokenizer to train, and {option('tokenizer')} gives one "
                         f"({tokenizer}); leave out one of them")


def saved_options(path: Path) -> PretrainOptions:
    """The options a run was started with, read back from its record."""
    try:
        return PretrainOptions.from_json(recorded_options(path))
    except (ValueError, KeyError, TypeError) as err:
        raise UsageError(f"{option('resume')}: {path} is damaged or not written by convattn "
                         f"({type(err).__name__}: {str(err)[:80]}); start a new run in another "
                         f"{option('output_dir')}") from None
