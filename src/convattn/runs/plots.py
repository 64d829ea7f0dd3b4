"""A folder of figures `convattn plot kernels|attention` writes (default: CHECKPOINT/plots): only its figures and
log.txt, so a folder holding anything else (a model, a run, a user's files, a link, even one named as a figure) is
someone else's."""

from __future__ import annotations

from pathlib import Path

from convattn.console import LOG_FILE
from convattn.runs.folder import LOCK_FILE, foreign_entries, is_code_or_temp

PLOTS_DIR = "plots"  # the default folder, inside the checkpoint
FIGURES = frozenset({"fixed_kernels.png", "depthwise_kernels.png", "dynamic_kernels.png", "attention_maps.png",
                     "convbert_kernels.png"})


def written_by_plot(entry: Path) -> bool:
    """A file `convattn plot` writes (a figure, log.txt, the lock, a figure's temporary file)."""
    return entry.is_file() and (entry.name in FIGURES or entry.name in (LOG_FILE, LOCK_FILE) or
                                is_code_or_temp(entry.name))


def foreign_files(out: Path) -> list[str]:
    """What a figures folder holds that `convattn plot` does not write, relative to it ([] for a missing one)."""
    return foreign_entries(out, lambda entry, _: written_by_plot(entry)) if Path(out).is_dir() else []
