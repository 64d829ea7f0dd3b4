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


@contextmanager
def run_folder_lock(folder: Path, flag: str = "--output-dir", enabled: bool = True) -> Iterator[None]:
    """Hold `folder` (created if needed) for this process; `enabled=False` (other ranks of a multi-process run,
    whose main process holds it) does nothing."""
    if not enabled:
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
