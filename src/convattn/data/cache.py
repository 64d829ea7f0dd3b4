"""Cache entries shared by concurrent runs: written once, complete or not at all, checked on every load.

An entry is a directory under the cache (a tokenizer, formatted data, the embedded corpus text). It is built
in a temporary directory of a unique name, a manifest of every file's size and SHA-256 is written last, and
the whole is renamed into place. A lock per entry (a sibling `.NAME.lock`) makes concurrent runs build it
once: the second waits and reuses the first one's entry. Temporary directories that killed runs left behind
are removed under the lock. An entry whose files no longer match its manifest is rebuilt.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from convattn.errors import UsageError, option
from convattn.files import write_json_atomic

MANIFEST = ".convattn-manifest.json"
USER_FIXABLE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG}

logger = logging.getLogger(__name__)


def check_cache_dir(cache_dir: Path) -> Path:
    """Create the cache directory if needed; a file or an unwritable place is a `UsageError`."""
    cache_dir = Path(cache_dir).expanduser()
    if cache_dir.is_file():
        raise UsageError(f"{option('cache_dir')} {cache_dir} is a file; point {option('cache_dir')} (or "
                         "$CONVATTN_CACHE) at a directory")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{option('cache_dir')} {cache_dir}: cannot create it ({err.strerror}); "
                         f"point {option('cache_dir')} (or $CONVATTN_CACHE) at a writable directory") from None
    return cache_dir


def cache_entry(directory: Path, build: Callable[[Path], None], what: str) -> Path:
    """`directory`, built by `build(empty temporary directory)` unless a complete entry is there already."""
    if entry_problem(directory) is None:
        return directory
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        with _entry_lock(directory, what):
            problem = entry_problem(directory)  # another run may have built it while this one waited
            if problem is None:
                return directory
            if directory.exists():
                logger.warning("rebuilding the cached %s in %s (%s)", what, directory, problem)
            _remove_leftovers(directory)
            _build_in_place(directory, build)
    except OSError as err:
        if err.errno not in USER_FIXABLE_ERRNOS:
            raise
        raise UsageError(f"cannot write the cached {what} in {directory.parent} ({err.strerror}); free space, "
                         f"or point {option('cache_dir')} (or $CONVATTN_CACHE) at a writable directory") from None
    return directory


@contextmanager
def _entry_lock(directory: Path, what: str) -> Iterator[None]:
    lock = FileLock(str(directory.with_name(f".{directory.name}.lock")))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.warning("waiting for another run that is building the cached %s in %s", what, directory)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _build_in_place(directory: Path, build: Callable[[Path], None]) -> None:
    tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        tmp.mkdir()
        build(tmp)
        write_manifest(tmp)
        try:
            os.rename(tmp, directory)
        except OSError:
            if entry_problem(directory) is not None:  # not a twin built where locks do not work (some NFS)
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # there only if the build failed or was interrupted


def _remove_leftovers(directory: Path) -> None:
    """Temporary directories of killed runs, and a damaged or unfinished entry (moved aside first, so it
    disappears at once)."""
    if directory.exists():
        doomed = directory.with_name(f"{directory.name}.tmp-damaged-{secrets.token_hex(4)}")
        os.rename(directory, doomed)
    for leftover in directory.parent.glob(f"{directory.name}.tmp*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------- manifest
def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(directory: Path) -> None:
    files = {p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in _files(directory)}
    write_json_atomic(directory / MANIFEST, {"files": files})


def entry_problem(directory: Path) -> str | None:
    """None if `directory` is a complete entry whose files match its manifest, else what is wrong."""
    try:
        listed = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))["files"]
        expected = {name: (int(entry["size"]), str(entry["sha256"])) for name, entry in listed.items()}
    except FileNotFoundError:
        return "unfinished: no manifest" if directory.exists() else "absent"
    except (ValueError, KeyError, TypeError, AttributeError):
        return "damaged manifest"
    present = {p.relative_to(directory).as_posix() for p in _files(directory)}
    if present != set(expected):
        return f"files differ from the manifest: {', '.join(sorted(present ^ set(expected))[:3])}"
    for name, (size, digest) in expected.items():
        path = directory / name
        if path.stat().st_size != size or _sha256(path) != digest:
            return f"{name} differs from its checksum"
    return None
