"""How OpenMP's idle threads wait, chosen by the command line before torch loads (OpenMP reads it once, then).

A thread that finishes its share of a parallel region waits for the next one, by spinning or by sleeping. Spinning
answers sooner but is CPU time, which a time budget's compute clock would count while other processes hold the CPU
the thread waits for; sleeping costs a wake-up per region. `python benchmarks/thread_wait.py --arms
sleeping,spinning,spin-1000` (RESULTS 5): on 2 quiet cores sleeping made a training step 1.2-1.4x slower than
libgomp's default spin of 300,000 rounds; beside two busy processes that spin doubled a step's CPU seconds and wall
time; 1,000 rounds and then sleep gave up 4-8 % of the quiet speed and 12-22 % of the compute clock's steps under
load. So threads sleep at once where a compute clock counts, and spin 1,000 rounds first everywhere else. A variable
the user set is kept (either of them: GOMP_SPINCOUNT overrides the policy in libgomp); OpenMP runtimes other than
libgomp, torch's on Linux, read only the policy.
"""

from __future__ import annotations

import os
from pathlib import Path

# libgomp's spin before sleeping outside a compute clock (rounds; about 10 us by libgomp's own estimate of 100,000
# rounds a millisecond): the measurement above
SPIN_ROUNDS = 1000
BUDGET_COMMANDS = ("pretrain", "compare")  # the commands with --time-budget


def choose_waiting(argv: list[str]) -> None:
    """Set OpenMP's waiting for the command `argv` runs, unless the user set it."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    if counts_compute(argv):
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    else:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_ROUNDS)


def threads_sleep() -> bool:
    """Whether the environment makes libgomp's idle threads sleep at once: GOMP_SPINCOUNT 0, or no spin count and
    OMP_WAIT_POLICY=PASSIVE (a spin count overrides the policy). It counts only as it was when torch loaded, which
    this cannot see."""
    spin = os.environ.get("GOMP_SPINCOUNT", "").strip()
    if spin:
        return spin == "0"
    return os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"


def compute_clock_warning(device_type: str) -> str | None:
    """The line a CPU run on a compute clock gets where idle threads spin (a library call without the command
    line's choice, or a variable the user set): spinning is CPU time the clock counts on a busy machine."""
    if device_type != "cpu" or threads_sleep():
        return None
    return ("OpenMP's idle threads spin while they wait (OMP_WAIT_POLICY is not PASSIVE): on a busy machine the "
            "compute clock counts that spinning and the budget buys fewer steps (beside two busy processes, about "
            "half: RESULTS 5); set OMP_WAIT_POLICY=PASSIVE before Python starts, as the command line does")


def counts_compute(argv: list[str]) -> bool:
    """Whether the command may train on a time budget's compute clock, read from its arguments alone (parsing them
    loads torch): pretrain or compare with --time-budget and not --budget-clock wall, or pretrain --resume of a run
    whose recorded options have a compute-clock budget. Where unsure, True: sleeping is never wrong, only slower.
    Flags may be abbreviated (argparse takes any unique prefix) or carry their value after '='."""
    command = next((word for word in argv if not word.startswith("-")), None)
    if command not in BUDGET_COMMANDS:
        return False
    budget, clock, resume, output = False, None, False, None
    for index, word in enumerate(argv):
        flag, has_value, value = word.partition("=")
        if not has_value:
            value = argv[index + 1] if index + 1 < len(argv) else None
        if _names(flag, "--time-budget"):
            budget = True
        elif _names(flag, "--budget-clock"):
            clock = value
        elif _names(flag, "--resume"):
            resume = True
        elif _names(flag, "--output-dir"):
            output = value
    if budget:
        return clock != "wall"
    if clock is None and resume and command == "pretrain":
        return _recorded_compute_budget(output)
    return False


def _names(word: str, flag: str) -> bool:
    """Whether `word` is `flag` or an abbreviation argparse would take for it (at least '--' and two letters)."""
    return word.startswith("--") and len(word) >= 4 and flag.startswith(word)


def _recorded_compute_budget(output: str | None) -> bool:
    """Whether the run in `output` recorded a time budget on the compute clock; True where that cannot be read."""
    if output is None:
        return True
    from convattn.runs.pretrain import OPTIONS_FILE, recorded_options

    try:
        options = recorded_options(Path(output).expanduser() / OPTIONS_FILE)
    except Exception:  # the command itself says what is wrong with the folder; here it only leaves threads asleep
        return True
    return options is None or (options.get("time_budget") is not None and options.get("budget_clock") != "wall")
