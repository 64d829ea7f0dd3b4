"""One writer per run folder: a lock file that names the process holding it.

The lock is `fcntl.flock` on `<folder>/.convattn.lock`, so the operating system releases it when the process
ends, however it ends (a kill -9 leaves no stale lock, only a lock file that the next run takes over). A second
process asking for a busy folder gets one `UsageError` naming the holder. The lock file is removed when the run
ends, and a folder the run created but wrote nothing into is removed with it.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from convattn.errors import UsageError

LOCK_FILE = ".convattn.lock"


def main_process() -> bool:
    """Rank 0 of a multi-process run (or the only process): the one that writes the run folder."""
    return int(os.environ.get("RANK", "0")) == 0


def check_output_folder(path: Path, flag: str = "--output-dir") -> None:
    """The folder exists or can be made: not a file, not a dangling link, no file on its way, writable."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise UsageError(f"{flag} {path} is a symbolic link to nothing ({os.readlink(path)}, which does not exist); "
                         "remove it or give another folder")
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file; give a folder (it is created if needed)")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise UsageError(f"{flag} {path}: {blocking} is a file, so the folder cannot be made")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {existing} is not writable")


@contextmanager
def run_folder_lock(folder: Path, flag: str = "--output-dir", enabled: bool | None = None) -> Iterator[None]:
    """Hold `folder` (created if needed) for this process. Only the main process holds it (`enabled` None):
    the other ranks of a multi-process run write nothing there."""
    if not (main_process() if enabled is None else enabled):
        yield
        return
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    descriptor = _acquire(path, flag)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"pid {os.getpid()} on {socket.gethostname()}, since {started}\n".encode(), 0)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # before the lock is released: a newcomer then finds no file, or a new one
        os.close(descriptor)
        if created and not any(folder.iterdir()):
            folder.rmdir()


def _acquire(path: Path, flag: str) -> int:
    """The locked descriptor of `path`. A lock taken on a file that its holder unlinked meanwhile is worthless
    (the next process creates a new file): then try again on the new one."""
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 300, 0).decode(errors="replace").strip() or "a process"
            os.close(descriptor)
            raise UsageError(f"{flag} {path.parent} is in use by another convattn run ({holder}); wait for it to "
                             f"end or choose another {flag}") from None
        try:
            if os.stat(path).st_ino == os.fstat(descriptor).st_ino:
                return descriptor
        except FileNotFoundError:
            pass
        os.close(descriptor)


def holds_only_lock(folder: Path) -> bool:
    """True for a folder that is empty but for a lock file (a run that stopped before writing anything)."""
    return all(p.name == LOCK_FILE for p in Path(folder).iterdir())
