"""`--overwrite` without losing the old run before the new one stands.

The old run's files are moved aside into REPLACED (a folder of the run folder, convattn's own) and removed only
once the new run has saved its first checkpoint (or its final model); a new run that fails or is stopped before
that gets its files removed and the old run back. A run killed outright (kill -9) cannot clean up: the next
pretraining run in that folder does (`recover_replaced_run`). Every move is a rename inside the folder, through
PARTIAL (the entries still to move back), so a kill at any point leaves a state the next run finishes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from convattn.console import say
from convattn.runs.folder import LOCK_FILE
from convattn.runs.pretrain import OPTIONS_FILE, PARTIAL, REPLACED, has_saved, remove_run_files, written_by_run


def move_aside(out: Path) -> None:
    """The old run's files (all of them convattn's: `check_output_dir` made sure) -> out/REPLACED."""
    partial = out / PARTIAL
    partial.mkdir()
    for entry in out.iterdir():
        if entry.name not in (LOCK_FILE, PARTIAL) and written_by_run(entry):
            entry.rename(partial / entry.name)
    partial.rename(out / REPLACED)


def options_record(out: Path) -> Path:
    """The options file of the run `out` holds: the old run's while a replacement that does not stand yet keeps it
    aside (the replacement, if killed, gives it back: `recover_replaced_run`)."""
    aside = out / REPLACED / OPTIONS_FILE
    return aside if aside.is_file() and not has_saved(out) else out / OPTIONS_FILE


def drop_replaced(out: Path) -> None:
    """The new run stands: the old one goes."""
    shutil.rmtree(out / REPLACED, ignore_errors=True)


def restore_replaced(out: Path) -> None:
    """The new run did not stand: its files go and the old run comes back (nothing to do without one aside)."""
    if (out / REPLACED).is_dir():
        remove_run_files(out)
        (out / REPLACED).rename(out / PARTIAL)
    move_back(out)


def move_back(out: Path) -> None:
    """The entries left in out/PARTIAL back into `out` (what a kill interrupted, either way)."""
    partial = out / PARTIAL
    if not partial.is_dir():
        return
    for entry in partial.iterdir():
        entry.rename(out / entry.name)
    partial.rmdir()


def recover_replaced_run(out: Path) -> None:
    """Finish what a killed --overwrite left: drop the old run if the new one stands, else bring it back."""
    if (out / REPLACED).is_dir() and has_saved(out):
        drop_replaced(out)
    elif (out / REPLACED).is_dir() or (out / PARTIAL).is_dir():
        restore_replaced(out)
        say("pretrain", f"{out}: the run that was replacing this one stopped before its first checkpoint; the "
                        "earlier run is back as it was")
