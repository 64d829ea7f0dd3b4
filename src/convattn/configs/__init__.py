"""The YAML files shipped with convattn: presets (one file per paper), recipes/<kind>/ and grids/.

Every reader goes through `load`, which refuses a key the reader does not know, so a misspelt key in a shipped
file fails loudly instead of being ignored.
"""

from __future__ import annotations

from collections.abc import Collection
from importlib import resources

import yaml


def _folder(*parts: str):
    return resources.files(__name__).joinpath(*parts)


def names(*folder: str) -> list[str]:
    """The stems of the YAML files in a shipped folder, sorted (e.g. names("recipes", "glue"))."""
    return sorted(entry.name.removesuffix(".yaml") for entry in _folder(*folder).iterdir()
                  if entry.name.endswith(".yaml"))


def read_text(*parts: str) -> str:
    return _folder(*parts).read_text()


def load(*parts: str, allowed: Collection[str]) -> dict:
    """A shipped YAML mapping (`parts` ends with the stem, e.g. ("grids", "convbert")), with only `allowed` keys."""
    *folder, stem = parts
    mapping = yaml.safe_load(read_text(*folder, f"{stem}.yaml")) or {}
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise ValueError(f"{'/'.join(parts)}.yaml has unknown keys {unknown}; allowed keys are {sorted(allowed)}")
    return mapping
