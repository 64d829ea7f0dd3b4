"""A fine-tuning job's folder (glue, squad): the results it writes, and where a comparison fine-tunes each of its
pretraining seeds (`<seed folder>/glue/`, `<seed folder>/squad/`)."""

from __future__ import annotations

from pathlib import Path

GLUE_RESULTS = "glue_results.json"
SQUAD_RESULTS = "squad_results.json"


def glue_dir(pretraining_seed: Path) -> Path:
    return Path(pretraining_seed) / "glue"


def squad_dir(pretraining_seed: Path) -> Path:
    return Path(pretraining_seed) / "squad"
