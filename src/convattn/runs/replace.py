"""`--overwrite` without losing the old run before the new one stands, for every job that replaces a folder
(pretrain, glue, squad): one `JobLayout` says what a job writes and when its new run stands.

The old run's files are moved aside into REPLACED (a folder of the run folder, convattn's own) and removed only
once the new run stands (pretraining: its first checkpoint or its final model; fine-tuning: its first finished
seed); a new run that fails or is stopped before that gets its files removed and the old run back. A run killed
outright (kill -9) cannot clean up: the next run of that job in the folder does (`recover_replaced_run`). Every
move is a rename inside the folder, through PARTIAL (the entries still to move back), so a kill at any point
leaves a state the next run finishes.

Before any of that, the next run of a job refuses a folder with a symbolic link where the job writes
(`check_no_links`: every move and removal here is then inside the folder), and removes the staging folders a
killed run left (`JobLayout.leftovers`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from convattn.console import say
from convattn.errors import option
from convattn.runs.folder import (
    LOCK_FILE,
    PARTIAL,
    REPLACED,
    check_no_links,
    check_only_own_files,
    check_removable,
    holds_only_lock,
)


def no_leftovers(out: Path) -> list[Path]:
    """A job whose kill leaves nothing half made (or whose next run finishes it itself)."""
    return []


@dataclass(frozen=True)
class JobLayout:
    """What one kind of job writes into its folder, as far as replacing it goes."""

    job: str                               # the console prefix: pretrain, glue, squad
    record: str                            # the file the job writes first (its options or its model record)
    written_by: Callable[[Path], bool]     # a top-level entry of the folder is one the job writes
    stands: Callable[[Path], bool]         # the folder holds a new run worth keeping
    milestone: str                         # what makes it stand, in words: "its first checkpoint"
    written_inside: Callable[[Path, Path], bool]  # (entry, folder): an entry at any depth is one the job writes
    leftovers: Callable[[Path], list[Path]] = no_leftovers  # the folders of the job's that a kill left half made

    def remove_written(self, out: Path) -> None:
        """Remove what the job wrote into `out` (the checks made sure nothing else is there), but the lock and an
        old run kept aside."""
        for entry in Path(out).iterdir():
            if entry.name in (LOCK_FILE, REPLACED, PARTIAL) or not self.written_by(entry):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def move_aside(out: Path, layout: JobLayout) -> None:
    """The old run's files (all of them convattn's: the checks made sure) -> out/REPLACED."""
    partial = out / PARTIAL
    partial.mkdir()
    for entry in out.iterdir():
        if entry.name not in (LOCK_FILE, PARTIAL) and layout.written_by(entry):
            entry.rename(partial / entry.name)
    partial.rename(out / REPLACED)


def replaced_record(out: Path, layout: JobLayout) -> Path:
    """The record of the run `out` holds: the old run's while a replacement that does not stand yet keeps it
    aside (the replacement, if killed, gives it back: `recover_replaced_run`)."""
    aside = out / REPLACED / layout.record
    return aside if aside.is_file() and not layout.stands(out) else out / layout.record


def drop_replaced(out: Path) -> None:
    """The new run stands: the old one goes."""
    shutil.rmtree(out / REPLACED, ignore_errors=True)


def drop_replaced_if_standing(out: Path, layout: JobLayout) -> None:
    """The old run goes once the new one stands (called after each checkpoint or seed)."""
    if (out / REPLACED).exists() and layout.stands(out):
        drop_replaced(out)


def restore_replaced(out: Path, layout: JobLayout) -> None:
    """The new run did not stand: its files go and the old run comes back (nothing to do without one aside)."""
    if (out / REPLACED).is_dir():
        layout.remove_written(out)
        (out / REPLACED).rename(out / PARTIAL)
    move_back(out)


def discard_unless_standing(out: Path, layout: JobLayout) -> None:
    """A new run that stopped before it stands saved nothing worth keeping: remove what it wrote (nothing else is
    in the folder: the checks made sure), and give back the run it was replacing, if any."""
    if not layout.stands(out):
        layout.remove_written(out)
        restore_replaced(out, layout)


def move_back(out: Path) -> None:
    """The entries left in out/PARTIAL back into `out` (what a kill interrupted, either way)."""
    partial = out / PARTIAL
    if not partial.is_dir():
        return
    for entry in partial.iterdir():
        entry.rename(out / entry.name)
    partial.rmdir()


def recover_replaced_run(out: Path, layout: JobLayout) -> None:
    """Finish what a killed run of this job left, once the folder holds no link where the job writes (refused by
    name: `check_no_links`): remove its half-made staging folders (`JobLayout.leftovers`), and after an
    --overwrite drop the old run if the new one stands, else bring it back. A folder aside that is not this job's
    (no record of it anywhere) is left alone."""
    out = Path(out)
    check_no_links(out, layout.written_inside)
    for leftover in layout.leftovers(out):
        shutil.rmtree(leftover)
    if not any((folder / layout.record).is_file() for folder in (out, out / REPLACED, out / PARTIAL)):
        return
    if (out / REPLACED).is_dir() and layout.stands(out):
        drop_replaced(out)
    elif (out / REPLACED).is_dir() or (out / PARTIAL).is_dir():
        restore_replaced(out, layout)
        say(layout.job, f"{out}: the run that was replacing this one stopped before {layout.milestone}; the "
                        "earlier run is back as it was")


def replaces(out: Path, layout: JobLayout, foreign: Callable[[Path], list[str]], overwrite: bool) -> bool:
    """Whether --overwrite (`overwrite`) has a run of this job in `out` to move aside; refuses, before anything is
    written, a folder that is not this job's or holds anything the job did not write (named, at any depth)."""
    out = Path(out)
    if not overwrite or not out.is_dir() or holds_only_lock(out):
        return False
    flag = option("overwrite")
    check_removable(out, layout.record, flag)
    check_only_own_files(out, foreign(out), flag)
    return True


@contextmanager
def replacing(out: Path, layout: JobLayout, replace: bool) -> Iterator[None]:
    """The job's writing, with the old run (`replace`: there is one to replace) moved aside first and given back
    if the new run fails or is stopped before it stands (`drop_replaced_if_standing` drops it once it does)."""
    if not replace:
        yield
        return
    say(layout.job, f"replacing the run in {out} (kept aside until the new one has {layout.milestone})")
    move_aside(out, layout)
    try:
        yield
    except BaseException:
        discard_unless_standing(out, layout)
        raise
    drop_replaced_if_standing(out, layout)
