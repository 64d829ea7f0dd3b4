"""Any run folder (pretraining, fine-tuning, comparison): who may write it, what it records, how it is laid out.

* one writer: `run_folder_lock`, `fcntl.flock` on `<folder>/.convattn.lock`, so the operating system releases it
  when the process ends, however it ends (a kill -9 leaves no stale lock, only a lock file that the next run takes
  over). A second process asking for a busy folder gets one `UsageError` naming the holder. The lock file is
  removed when the run ends, and the folders the run created but wrote nothing into (the parents it made
  included) are removed with it;
* links: the folder given is followed, but nothing inside it is written or removed through a symbolic link. A
  link where a run's file or folder goes is refused by name (`check_no_links`, `foreign_entries`), a hard-linked
  file convattn writes in place (the lock, log.txt) is replaced by a file of its own, so its other names keep
  their content;
* checks before anything is written: `check_output_folder` (a folder can be made there), `check_own_folder` (a
  folder holding anything but a run of the same kind is someone else's), `check_removable` (only a folder holding
  convattn's run record may be replaced);
* the run record: `changed_options` (what differs from the options a folder was made with, leaving out
  `BOOKKEEPING_OPTIONS`) and `check_same_options`;
* layout: `seed_dir` (`<folder>/runs/<name>/seed<k>`).
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import socket
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from convattn.console import LOG_FILE, main_process
from convattn.errors import UsageError, listed, option
from convattn.files import special_file

LOCK_FILE = ".convattn.lock"
# an old run kept aside by --overwrite until the new one stands (replace.py); PARTIAL while it is being moved
REPLACED, PARTIAL = ".replaced-run", ".replaced-run.partial"
# options that say where and how verbosely a run is written, not what it computes: they may differ between a
# run folder and the invocation that continues or reuses it
BOOKKEEPING_OPTIONS = ("output_dir", "resume", "overwrite", "log_every", "cache_dir")


def check_output_folder(path: Path, flag: str = option("output_dir")) -> None:
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
    check_can_make(path, flag)


def check_can_make(path: Path, flag: str, given: Path | None = None) -> None:
    """The first folder missing on the way to `path` can be made: it is made and removed again. A folder such as
    /proc or /sys, or a full or read-only filesystem, looks writable and refuses it: a bare errno, later. The
    error names `given` (the flag's value), `path` by default."""
    missing = next((p for p in reversed((path, *path.parents)) if not p.exists()), None)
    if missing is None:
        return
    try:
        missing.mkdir()
    except FileExistsError:  # made meanwhile, by someone else: theirs, and makeable
        return
    except OSError as err:
        raise UsageError(f"{flag} {given or path}: {missing} cannot be made ({err.strerror or err}); give a folder "
                         "on a filesystem you can write to") from None
    with suppress(OSError):
        missing.rmdir()  # this process's own, empty folder


@contextmanager
def run_folder_lock(folder: Path, flag: str = option("output_dir"), enabled: bool | None = None) -> Iterator[None]:
    """Hold `folder` (created if needed) for this process. Only the main process holds it (`enabled` None):
    the other ranks of a multi-process run write nothing there."""
    if not (main_process() if enabled is None else enabled):
        yield
        return
    folder = Path(folder)
    # the folders made here, the deepest first (`squad/<model>` may make `squad/` too)
    created = [p for p in (folder, *folder.parents) if not p.exists() and not p.is_symlink()]
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
        remove_if_empty(created)


def remove_if_empty(folders: list[Path]) -> None:
    """Remove `folders` (made by this run, the deepest first) while they are empty: a refused command leaves
    none of them behind."""
    for path in folders:
        if path.is_symlink() or not path.is_dir() or any(path.iterdir()):
            return
        path.rmdir()


def _acquire(path: Path, flag: str) -> int:
    """The locked descriptor of `path`, a plain file of this name only. A lock taken on a file that its holder
    unlinked meanwhile is worthless (the next process creates a new file): then try again on the new one. A
    link, folder or special file there is refused; a file with other names too (a hard link) is unlinked once
    locked and made anew, so that writing the lock leaves their content alone."""
    while True:
        _check_lock_file(path, flag)
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            if err.errno == errno.ELOOP:  # a link made since the check: named there
                continue
            raise
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):  # one made since the check: named there
            os.close(descriptor)
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 300, 0).decode(errors="replace").strip() or "a process"
            os.close(descriptor)
            raise UsageError(f"{flag} {path.parent} is in use by another convattn run ({holder}); wait for it to "
                             f"end or choose another {flag}") from None
        try:
            if os.lstat(path).st_ino == status.st_ino:
                if status.st_nlink == 1:
                    return descriptor
                path.unlink()
        except FileNotFoundError:
            pass
        os.close(descriptor)


def _check_lock_file(path: Path, flag: str) -> None:
    if path.is_symlink():
        raise UsageError(link_refusal(flag, path.parent, [path.name]))
    if kind := special_file(path) or ("a folder" if path.is_dir() else None):
        raise UsageError(f"{flag} {path.parent}: {path} is {kind}, not convattn's lock file; remove it")


def check_own_folder(folder: Path, records: tuple[str, ...], flag: str = option("output_dir")) -> None:
    """Refuse, before anything is written, a folder that is neither missing, empty (a lock file aside) nor a run of
    this kind (one holding a file of `records`, which such a run writes first; an old run an --overwrite keeps
    aside does not count): it holds someone else's files, which the run's own files of the same names (a
    report.md, a submission/) would overwrite. A link at its log.txt, which the run appends to, is refused too."""
    folder = Path(folder)
    if (folder / LOG_FILE).is_symlink():
        raise UsageError(link_refusal(flag, folder, [LOG_FILE]))
    if not folder.is_dir() or any((folder / record).is_file() for record in records):
        return
    others = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir()
                    if p.name not in (LOCK_FILE, REPLACED, PARTIAL))
    if others:
        raise UsageError(f"{flag} {folder} holds files convattn did not write ({listed(others)}); choose another "
                         f"{flag}, or move them out")


def is_code_or_temp(name: str) -> bool:
    """The modeling code saved with a model, or the temporary file of an atomic write (a kill can leave one)."""
    return (name.startswith("convattn_") and name.endswith(".py")) or \
        (name.startswith(".") and (name.endswith(".tmp") or name.endswith(".png")) and name.count(".") >= 3)


def holds_only_lock(folder: Path) -> bool:
    """True for a folder that is empty but for a lock file (a run that stopped before writing anything)."""
    return all(p.name == LOCK_FILE for p in Path(folder).iterdir())


def seed_dir(folder: Path, name: str, seed: int | None = None) -> Path:
    """`<folder>/runs/<name>/seed<k>` (the run's own folder when seed is None)."""
    path = Path(folder) / "runs" / name
    return path if seed is None else path / f"seed{seed}"


def foreign_entries(out: Path, written_inside: Callable[[Path, Path], bool]) -> list[str]:
    """What `out` holds that `written_inside(entry, out)` says a job did not write, at any depth, relative to
    `out` (a folder is named with a trailing /, not what it holds). A symbolic link is never the job's: it is named
    '<path> (a link)', and not followed."""
    return sorted(named(entry, out) for entry, ours in _entries(out, written_inside) if not ours or entry.is_symlink())


def check_no_links(out: Path, written_inside: Callable[[Path, Path], bool], flag: str = option("output_dir")) -> None:
    """Refuse, naming them, the symbolic links of `out` (at any depth) where a job writes its files and folders
    (`written_inside`): the job would write, replace or remove what they point to, outside its folder."""
    if Path(out).is_dir() and (links := [str(entry.relative_to(out)) for entry, ours in _entries(out, written_inside)
                                         if ours and entry.is_symlink()]):
        raise UsageError(link_refusal(flag, out, links))


def link_refusal(flag: str, folder: Path, links: list[str]) -> str:
    """The one line refusing `links` (relative to `folder`) where a run's files go."""
    return (f"{flag} {folder}: {listed(links)} {'is a symbolic link' if len(links) == 1 else 'are symbolic links'} "
            "where convattn writes its own files, and it never writes or removes through a link: remove "
            f"{'it' if len(links) == 1 else 'them'}, or move what {'it points' if len(links) == 1 else 'they point'}"
            " to into its place")


def named(entry: Path, out: Path) -> str:
    """`entry` relative to `out` as a message names it: a folder with a trailing /, a link as '<path> (a link)'."""
    name = str(entry.relative_to(out))
    return f"{name} (a link)" if entry.is_symlink() else name + ("/" if entry.is_dir() else "")


def _entries(out: Path, written_inside: Callable[[Path, Path], bool]) -> Iterator[tuple[Path, bool]]:
    """Every entry of `out` and whether `written_inside` says it is the job's, at any depth: the folders of the
    job's are entered, links and anything else are not."""
    folders = [Path(out)]
    while folders:
        for entry in sorted(folders.pop().iterdir()):
            ours = written_inside(entry, out)
            yield entry, ours
            if ours and entry.is_dir() and not entry.is_symlink():
                folders.append(entry)


def check_only_own_files(folder: Path, foreign: list[str], flag: str = option("overwrite"),
                         what: str = "files convattn did not write") -> None:
    """Refuse, naming them, the files of `folder` a job did not write (`foreign`, relative to it)."""
    if foreign:
        raise UsageError(f"{flag}: {folder} holds {what} ({', '.join(foreign[:5])}"
                         f"{', ...' if len(foreign) > 5 else ''}); move them out, or choose another "
                         f"{option('output_dir')}")


def check_removable(path: Path, record: str, flag: str = option("overwrite")) -> None:
    """Refuse, before any work, to remove a folder convattn did not write: the working directory or one of its
    parents, a home directory, or a non-empty folder without the run record `record` that convattn writes first."""
    path = Path(path)
    resolved, cwd = path.resolve(), Path.cwd().resolve()
    if cwd.is_relative_to(resolved) or resolved in (Path.home().resolve(), Path("/root")) or \
            resolved.parent == Path("/home"):
        raise UsageError(f"{flag}: will not remove {path} (the working directory, one of its parents, a home "
                         f"directory or the filesystem root); choose another {option('output_dir')}")
    held = sorted(p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in path.iterdir()
                  if p.name != LOCK_FILE) if path.is_dir() else []
    if held and not (path / record).is_file():
        raise UsageError(f"{flag}: {path} is not a convattn run (no {record}; it holds {listed(held)}); convattn "
                         f"only replaces what it wrote: choose another {option('output_dir')}, or empty that "
                         "directory yourself")


def changed_fields(saved: dict, current: dict, allowed: tuple[str, ...] = BOOKKEEPING_OPTIONS) -> list[str]:
    """The options (other than `allowed`) whose values differ, sorted."""
    return sorted(k for k in set(saved) | set(current) if k not in allowed and saved.get(k) != current.get(k))


def changed_options(saved: dict, current: dict, allowed: tuple[str, ...] = BOOKKEEPING_OPTIONS,
                    name: Callable[[str], str] = str) -> str:
    """'key: old -> new, ...' for the options (other than `allowed`) that differ, each key as `name` says it; ''
    when none do."""
    return ", ".join(f"{name(k)}: {saved.get(k)!r} -> {current.get(k)!r}"
                     for k in changed_fields(saved, current, allowed))


def check_same_options(saved: dict | None, current: dict, allowed: tuple[str, ...], problem: str) -> None:
    """Raise UsageError '<problem> (<changes>); <...>' when the `saved` options (None: none recorded) differ from
    `current`."""
    if saved is None:
        return
    if details := changed_options(saved, current, allowed):
        raise UsageError(problem.format(details=details))
