"""What a fine-tuning job that fails or is stopped (an error, Ctrl-C, SIGTERM, a full disk) leaves behind: nothing
partial. A seed's folder goes with its half-written files (the seed starts again from nothing), and a job started
in a new or empty folder leaves nothing at all until its first seed has finished, so the same command starts it
again. (An --overwrite gives the old job back: `convattn.runs.replace.replacing`.)"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from convattn.runs.folder import holds_only_lock
from convattn.runs.replace import JobLayout, discard_unless_standing


@contextmanager
def seed_attempt(seed_folder: Path) -> Iterator[None]:
    """One seed's training into `seed_folder`, which is removed if it fails or is stopped."""
    try:
        yield
    except BaseException:
        shutil.rmtree(seed_folder, ignore_errors=True)
        raise


@contextmanager
def new_job(out: Path, layout: JobLayout) -> Iterator[None]:
    """The job's writing into `out` (held by this process): started in a folder holding nothing (a lock aside),
    whatever it wrote goes if it fails or is stopped before its first finished seed."""
    fresh = holds_only_lock(out)
    try:
        yield
    except BaseException:
        if fresh:
            discard_unless_standing(out, layout)
        raise
