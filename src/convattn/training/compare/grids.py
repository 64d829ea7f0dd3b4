"""Grids of runs for `convattn compare`: shipped YAML files in `convattn/configs/grids/`, or a list of presets.

A grid file has `runs` (a list of preset names, or mappings `{name, preset, model}` for runs that change config
fields of a preset) and, optionally, a `description`, a pretraining `recipe`, `model` (config fields for every
run) and `training` (recipe fields for every run, e.g. max_steps).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from convattn import configs
from convattn.errors import UsageError, option
from convattn.presets import preset_names
from convattn.training.recipes import Recipe

GRID_KEYS = ("description", "recipe", "model", "training", "runs")
# Recipe fields a grid or the command line may set for every run (the preset and seed are the runs' own)
TRAINING_FIELDS = tuple(f.name for f in dataclasses.fields(Recipe) if f.name not in ("preset", "model", "seed"))


@dataclass(frozen=True)
class RunSpec:
    """One row of a comparison: a preset and the config fields that only this row changes."""

    name: str
    preset: str
    model: dict = field(default_factory=dict)

    @property
    def slug(self) -> str:
        """The run's directory name under runs/ (slashes and anything odd become safe characters)."""
        return re.sub(r"[^A-Za-z0-9._+=-]+", "_", self.name.replace("/", "--"))


@dataclass
class Grid:
    """What to compare: runs, plus a recipe and overrides shared by all of them (all optional)."""

    name: str
    runs: list[RunSpec]
    description: str = ""
    recipe: str | None = None
    model: dict = field(default_factory=dict)  # config fields for every run
    training: dict = field(default_factory=dict)  # Recipe fields for every run


def grid_names() -> list[str]:
    return configs.names("grids")


def load_grid(name: str) -> Grid:
    """A shipped grid (`convattn/configs/grids/NAME.yaml`)."""
    if name not in grid_names():
        raise UsageError(f"unknown grid {name!r}; choose {option('grid')} from {', '.join(grid_names())} "
                         f"(or list models with {option('presets')})")
    spec = configs.load("grids", name, allowed=GRID_KEYS)
    training = spec.get("training") or {}
    bad = sorted(set(training) - set(TRAINING_FIELDS))
    if bad:
        raise ValueError(f"grid {name!r}: training keys {bad} are not recipe fields ({', '.join(TRAINING_FIELDS)})")
    runs = [RunSpec(entry, entry) if isinstance(entry, str) else RunSpec(entry["name"], entry["preset"],
                                                                          entry.get("model") or {})
            for entry in spec.get("runs") or []]
    grid = Grid(name, runs, spec.get("description", ""), spec.get("recipe"), spec.get("model") or {}, training)
    check_runs(grid.runs)
    return grid


def grid_from_presets(presets: list[str], name: str = "presets") -> Grid:
    """A grid of plain presets, from a comma-separated command-line list."""
    return Grid(name, [RunSpec(preset, preset) for preset in presets])


def preset_listing() -> str:
    """Every preset on one line, grouped by family: `family/{a,b,c}`."""
    families: dict[str, list[str]] = {}
    for name in preset_names():
        family, _, row = name.partition("/")
        families.setdefault(family, []).append(row)
    return ", ".join(f"{family}/{{{','.join(rows)}}}" for family, rows in families.items())


def check_runs(runs: list[RunSpec]) -> None:
    if not runs:
        raise UsageError(f"no runs to compare; give {option('presets')} P1,P2,... (presets: {preset_listing()}) "
                         f"or {option('grid')} (one of {', '.join(grid_names())})")
    known = set(preset_names())
    for run in runs:
        if run.preset not in known:
            raise UsageError(f"unknown preset {run.preset!r}; presets are {preset_listing()}")
    names = [run.name for run in runs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UsageError(f"{', '.join(repeated)} listed more than once; list each run once")
    slugs = [run.slug for run in runs]
    if len(set(slugs)) < len(slugs):
        raise UsageError(f"run names {', '.join(names)} clash as directory names; rename them")


