"""Named presets: YAML files in `convattn/configs/`, one per paper, one entry per table row.

A file has a `base` mapping of config fields shared by its rows and a `variants` mapping from row
name to the fields that differ. A file may also declare a `grid` of values (`{n: [128, 256]}`):
variant names and string values may then use `{n}` placeholders, and `where` (a Python
comparison over the grid names, e.g. `k < n`) drops combinations that make no sense. Preset names
are `<file stem>/<variant>`.
"""

from __future__ import annotations

import copy
import itertools
import re
from functools import cache

from convattn import configs

_PLACEHOLDER = re.compile(r"^\{(\w+)\}$")


def _fill(value, bindings: dict):
    """Substitute grid values into a variant: a whole-string placeholder keeps the value's type."""
    if isinstance(value, str):
        whole = _PLACEHOLDER.match(value)
        if whole and whole.group(1) in bindings:
            return bindings[whole.group(1)]
        return value.format(**bindings)
    if isinstance(value, list):
        return [_fill(v, bindings) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, bindings) for k, v in value.items()}
    return value


def _grid_bindings(grid: dict, where: str | None):
    names = list(grid)
    for values in itertools.product(*(grid[name] for name in names)):
        bindings = dict(zip(names, values, strict=True))
        if where is None or eval(where, {"__builtins__": {}}, dict(bindings)):  # our own files, not user input
            yield bindings


FAMILY_KEYS = ("base", "grid", "where", "variants")


def _load_family(name: str) -> dict[str, dict]:
    spec = configs.load(name, allowed=FAMILY_KEYS)
    base = spec.get("base", {})
    grid = spec.get("grid")
    rows: dict[str, dict] = {}
    for variant, fields in spec["variants"].items():
        fields = fields or {}
        for bindings in _grid_bindings(grid, spec.get("where")) if grid and "{" in variant else [{}]:
            rows[variant.format(**bindings)] = {**copy.deepcopy(base), **_fill(fields, bindings)}
    return rows


@cache
def _all_presets() -> dict[str, dict]:
    presets: dict[str, dict] = {}
    for family in configs.names():
        for variant, fields in _load_family(family).items():
            presets[f"{family}/{variant}"] = fields
    return presets


def preset_names() -> list[str]:
    return list(_all_presets())


def preset_fields(name: str) -> dict:
    presets = _all_presets()
    if name not in presets:
        families = sorted({p.split("/")[0] for p in presets})
        raise ValueError(
            f"unknown preset {name!r}; presets are <family>/<row> with family one of {', '.join(families)} "
            "(run `convattn presets` for the full list)"
        )
    return copy.deepcopy(presets[name])
