"""From what a user asks for to a run's `PretrainOptions`: a new run resolves its recipe (`resolve_recipe`); a
resumed run reads its own options back and takes only what is given now on top (the run then checks what
changed)."""

from __future__ import annotations

from pathlib import Path

from convattn.console import say
from convattn.errors import UsageError, option
from convattn.files import read_json
from convattn.training.pretrain.options import PretrainOptions
from convattn.training.pretrain.replace import options_record
from convattn.training.recipes import recipe_for_preset, resolve_recipe


def resolve_options(output_dir: Path | None = None, preset: str | None = None, recipe: str | None = None,
                    model: dict | None = None, training: dict | None = None, data: dict | None = None,
                    precision: str | None = None, compile: bool = False, log_every: int | None = None,
                    resume: bool = False, overwrite: bool = False,
                    allow_schedule_change: bool = False) -> PretrainOptions:
    """The options of a pretraining run. `model`: config fields over the preset's; `training`: Recipe fields over
    the recipe's; `data`: the PretrainOptions data fields given (None or empty: not given). The output folder
    defaults to runs/pretrain-<recipe>."""
    data = {name: value for name, value in (data or {}).items() if value}
    if resume and output_dir is not None and options_record(output_dir).is_file():
        options = saved_options(options_record(output_dir))
        if preset:
            options.recipe.preset = preset
        options.recipe.model = {**options.recipe.model, **(model or {})}
        for name, value in (training or {}).items():
            setattr(options.recipe, name, value)
        for name, value in data.items():
            setattr(options, name, Path(value) if name == "cache_dir" else value)
        if precision not in (None, "auto"):
            options.precision = precision
        options.compile = compile or options.compile
        options.output_dir, options.resume, options.overwrite = output_dir, True, overwrite
        options.allow_schedule_change = allow_schedule_change
        return options
    resolved, note = resolve_recipe(preset, recipe, model, training)
    if note:
        say("pretrain", note)
    extra = {"log_every": log_every} if log_every is not None else {}
    return PretrainOptions(
        recipe=resolved, output_dir=output_dir or Path("runs") / f"pretrain-{recipe or recipe_for_preset(preset)}",
        **data, precision=precision or "auto", compile=compile, resume=resume, overwrite=overwrite,
        allow_schedule_change=allow_schedule_change, **extra,
    )


def saved_options(path: Path) -> PretrainOptions:
    """The options a run was started with, read back from its record."""
    try:
        return PretrainOptions.from_json(read_json(path))
    except (ValueError, KeyError, TypeError) as err:
        raise UsageError(f"{option('resume')}: {path} is damaged or not written by convattn "
                         f"({type(err).__name__}: {str(err)[:80]}); start a new run in another "
                         f"{option('output_dir')}") from None
