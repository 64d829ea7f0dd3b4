"""What a command prints: one progress bar per long phase and short `convattn <command>: ...` lines (`say`).

The libraries' own output (transformers' load reports and warnings, Python warnings of any library, the Trainer's
per-log dicts, datasets' Map bars, weight-loading bars) goes to the run folder's `log.txt` instead: `configure`
(called by the command line for every command that loads models) captures it, kept in memory until the command
knows its folder and calls `log_to`. `--verbose` also shows it live, at info level, with the libraries' progress
bars. Errors still reach the screen.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from convattn.errors import UsageError
from convattn.files import append_text, check_plain_file

LOG_FILE = "log.txt"
# loggers whose records go to log.txt; py.warnings: the Python warnings of any library (torch's pin_memory on CPU,
# deprecations), which `configure` routes there
CAPTURED = ("transformers", "datasets", "convattn", "py.warnings")


def main_process() -> bool:
    """Rank 0 of a multi-process run, or a process that runs alone (whatever RANK a former launch left set): the one
    that prints, takes the run folder's lock and writes it."""
    return launch_number("RANK", 0) == 0 or world_size() == 1


def world_size() -> int:
    """The processes that joined this run (torch's launchers set WORLD_SIZE; 1 without one)."""
    return launch_number("WORLD_SIZE", 1)


def launch_number(name: str, unset: int) -> int:
    """The launcher's variable `name` (RANK, WORLD_SIZE, LOCAL_RANK) as a number (`unset` where it is not set); one
    line naming it where it is not a count a launcher sets (WORLD_SIZE=0, RANK=one)."""
    value = os.environ.get(name)
    if value is None:
        return unset
    least = 1 if name == "WORLD_SIZE" else 0
    try:
        number = int(value.strip())
    except ValueError:
        number = least - 1
    if number < least:
        raise UsageError(f"{name}={value!r} is not a {'number of processes' if least else 'process number'} (a whole "
                         f"number, at least {least}), as a launcher sets it: a leftover or a typo; unset it (e.g. "
                         f"env -u {name} convattn ...) to run one process, or start several with torchrun "
                         "--nproc-per-node N")
    return number


def check_launch_environment() -> None:
    """The launcher's variables a process reads, each a number, and none left over from another launch: a
    LOCAL_RANK without WORLD_SIZE would make the Trainer join a process group that no launcher started."""
    size = world_size()
    launch_number("RANK", 0)
    local_rank = launch_number("LOCAL_RANK", 0)
    if "LOCAL_RANK" in os.environ and "WORLD_SIZE" not in os.environ:
        raise UsageError(f"LOCAL_RANK={local_rank} is set, but this process runs alone (WORLD_SIZE is unset): a "
                         "leftover of another launch; unset LOCAL_RANK (e.g. env -u LOCAL_RANK convattn ...), or "
                         "start several processes with torchrun --nproc-per-node N")
    if size > 1 and launch_number("RANK", 0) >= size:
        raise UsageError(f"RANK={os.environ['RANK']} is not below WORLD_SIZE={size}: a leftover of another launch; "
                         "unset RANK and WORLD_SIZE (e.g. env -u RANK -u WORLD_SIZE convattn ...), or start several "
                         "processes with torchrun --nproc-per-node N")


def processes() -> str:
    """'1 process', '4 processes': for a job's start line."""
    count = world_size()
    return f"{count} process{'' if count == 1 else 'es'}"


# launchers that say how many processes they started, where torch's WORLD_SIZE says how many joined
LAUNCHER_SIZES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def launch_warning() -> str | None:
    """A warning when the environment promises more processes than joined this run, or None."""
    joined = world_size()
    for name in LAUNCHER_SIZES:
        promised = os.environ.get(name, "")
        if promised.isdigit() and int(promised) > joined:
            return (f"{name}={promised} says {promised} processes were started, but {joined} joined this run "
                    "(WORLD_SIZE): each runs alone; launch with torchrun --nproc_per_node N instead")
    if "MASTER_ADDR" in os.environ and "WORLD_SIZE" not in os.environ:
        return ("MASTER_ADDR is set, as launchers of several processes do, but this process runs alone (no "
                "WORLD_SIZE): accelerate launch starts several processes with --multi_gpu --num_processes N (on CPU "
                "too; --cpu or a MULTI_CPU config starts one), or use torchrun --nproc_per_node N")
    return None


def say_launch(command: str) -> None:
    """Say the warning of `launch_warning`, if any."""
    if warning := launch_warning():
        say(command, f"warning: {warning}")


def say(command: str, message: str) -> None:
    """A progress line on stderr ('convattn COMMAND: message'), from the main process only."""
    if main_process():
        print(f"convattn {command}: {message}", file=sys.stderr, flush=True)


class RunLog(logging.Handler):
    """Log records as lines: held in memory until `attach`, then appended to the file (never through a link)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        self.pending: list[str] = []
        self.path: Path | None = None

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record)
        if self.path is None:
            self.pending.append(line)
        else:
            self._append([line])

    def attach(self, path: Path) -> None:
        """Append to `path` from now on: a plain file, never a link (refused by name: `check_plain_file`)."""
        check_plain_file(path)
        self.path = path.absolute()  # the folder the command named, whatever the working folder becomes
        lines, self.pending = self.pending, []
        if lines:
            self._append(lines)

    def _append(self, lines: list[str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)  # the folder appears with its first line
        append_text(self.path, "\n".join(lines) + "\n")


_run_log: RunLog | None = None  # set once a command configured the output: the libraries' lines for log.txt
_verbose = False  # --verbose: they also print live
_saved: dict[str, tuple[list[logging.Handler], int, bool]] = {}  # captured logger -> its handlers, level, propagate


def configure(verbose: bool) -> None:
    """Capture the libraries' output for log.txt; with `verbose` they also print it live, at info level (the
    Trainer's "Running training" summary and log dicts), with their progress bars."""
    global _run_log, _verbose
    import datasets
    import transformers

    release()  # an earlier command of this process that did not release (tests calling configure directly)
    _run_log, _verbose = RunLog(), verbose
    if verbose:
        datasets.enable_progress_bars()
        transformers.utils.logging.enable_progress_bar()
    else:
        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
    screen = logging.StreamHandler()  # errors only, or (verbose) everything, named by its library
    screen.setLevel(logging.INFO if verbose else logging.ERROR)
    if verbose:
        screen.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    for name in CAPTURED:
        logger = logging.getLogger(name)
        _saved[name] = (logger.handlers[:], logger.level, logger.propagate)
        logger.handlers, logger.propagate = [_run_log, screen], False
        logger.setLevel(logging.INFO)
    # anew, release having let go: whoever replaced warnings.showwarning since (a test's recorder) is wrapped
    logging.captureWarnings(True)


def release() -> None:
    """The libraries' loggers as they were before `configure`: a command's end, so that what a process logs
    afterwards (a test, a notebook calling the library) goes nowhere near that command's log.txt."""
    global _run_log
    for name, (handlers, level, propagate) in _saved.items():
        logger = logging.getLogger(name)
        logger.handlers, logger.propagate = handlers, propagate
        logger.setLevel(level)
    _saved.clear()
    _run_log = None
    logging.captureWarnings(False)


def log_to(folder: Path) -> Path | None:
    """From now on (and what was captured before) the libraries' output goes to folder/log.txt."""
    if _run_log is None:
        return None
    _run_log.attach(Path(folder) / LOG_FILE)
    return _run_log.path


def captured() -> bool:
    """Whether the libraries' output goes to log.txt only (not --verbose)."""
    return _run_log is not None and not _verbose
