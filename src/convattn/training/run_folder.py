"""What every command that writes a run folder shares (pretrain, glue, compare, squad).

* figures: `save_figure` (written atomically, as every file is: see `convattn.files`);
* the run record: `changed_options` (what differs from the options a folder was made with,
  leaving out `BOOKKEEPING_OPTIONS`);
* statistics over seeds: `mean_sem` and its table cell `format_mean_sem`;
* console output: `say` (one progress line on stderr, from the main process only);
* layout: `seed_dir` (`<folder>/runs/<name>/seed<k>`);
* identity: `model_identity` (what results are keyed on: the saved weights and config, not a folder name);
* safety: `check_removable` (only a folder holding convattn's run record may be replaced).
"""

from __future__ import annotations

import hashlib
import math
import os
import statistics
import sys
from pathlib import Path

from convattn.errors import UsageError
from convattn.files import atomic_path, read_json

# options that say where and how verbosely a run is written, not what it computes: they may differ between a
# run folder and the invocation that continues or reuses it
BOOKKEEPING_OPTIONS = ("output_dir", "resume", "overwrite", "log_every", "cache_dir")


# ---------------------------------------------------------------------------------- figures
def save_figure(fig, path: Path, dpi: int = 130) -> Path:
    """Save a matplotlib `Figure` as PNG via a temporary file, so a crash never leaves half an image."""
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
    return Path(path)


# ---------------------------------------------------------------------------------- the run record
def changed_options(saved: dict, current: dict, allowed: tuple[str, ...] = BOOKKEEPING_OPTIONS) -> str:
    """'key: old -> new, ...' for the options (other than `allowed`) that differ; '' when none do."""
    changed = sorted(k for k in set(saved) | set(current) if k not in allowed and saved.get(k) != current.get(k))
    return ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in changed)


def check_same_options(saved_file: Path, current: dict, allowed: tuple[str, ...], problem: str) -> None:
    """Raise UsageError '<problem> (<changes>); <...>' when the options in `saved_file` differ from `current`."""
    saved = read_json(saved_file)
    if saved is None:
        return
    if details := changed_options(saved, current, allowed):
        raise UsageError(problem.format(details=details))


# ---------------------------------------------------------------------------------- statistics over seeds
def mean_sem(values: list[float]) -> dict | None:
    """Mean, sample standard deviation and standard error of the mean (std and sem are None for one value)."""
    if not values:
        return None
    std = statistics.stdev(values) if len(values) > 1 else None
    sem = std / math.sqrt(len(values)) if std is not None else None
    return {"mean": statistics.fmean(values), "std": std, "sem": sem, "n": len(values), "values": list(values)}


def format_mean_sem(stat: dict | None, digits: int = 1, spread: str = "sem", thousands: bool = False) -> str:
    """'mean ± spread' (spread: 'sem' or 'std'), the mean alone for one seed, '–' for nothing."""
    if stat is None:
        return "–"
    number = f"{{:{',' if thousands else ''}.{digits}f}}"
    if stat[spread] is None:
        return number.format(stat["mean"])
    return f"{number.format(stat['mean'])} ± {number.format(stat[spread])}"


# ---------------------------------------------------------------------------------- console and layout
def say(command: str, message: str) -> None:
    """A progress line on stderr ('convattn COMMAND: message'), from the main process only."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"convattn {command}: {message}", file=sys.stderr, flush=True)


def seed_dir(folder: Path, name: str, seed: int | None = None) -> Path:
    """`<folder>/runs/<name>/seed<k>` (the run's own folder when seed is None)."""
    path = Path(folder) / "runs" / name
    return path if seed is None else path / f"seed{seed}"


def check_removable(path: Path, record: str, flag: str = "--overwrite") -> None:
    """Refuse, before any work, to remove a folder convattn did not write: the working directory or one of its
    parents, a home directory, or a non-empty folder without the run record `record` that convattn writes first."""
    path = Path(path)
    resolved, cwd = path.resolve(), Path.cwd().resolve()
    if cwd.is_relative_to(resolved) or resolved in (Path.home().resolve(), Path("/root")) or \
            resolved.parent == Path("/home"):
        raise UsageError(f"{flag}: will not remove {path} (the working directory, one of its parents, a home "
                         "directory or the filesystem root); choose another --output-dir")
    if path.is_dir() and any(path.iterdir()) and not (path / record).is_file():
        raise UsageError(f"{flag}: {path} is not a convattn run (no {record}); convattn only replaces what it "
                         "wrote: choose another --output-dir, or empty that directory yourself")


def model_identity(model: str | Path) -> str:
    """A fingerprint of a saved model: sha256 over its config.json and *.safetensors files (16 hex digits). A hub
    id, which is not a local directory, stands for itself."""
    path = Path(model)
    if not path.is_dir():
        return str(model)
    digest = hashlib.sha256()
    for file in [path / "config.json", *sorted(path.glob("*.safetensors"))]:
        if file.is_file():
            digest.update(file.name.encode())
            with file.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
    return digest.hexdigest()[:16]
