"""Timing and memory helpers shared by the benchmarks (not by the library)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

from convattn.files import write_text_atomic as write_atomic  # noqa: F401  (the benchmarks' writer)


def time_interleaved(steps: dict[str, Callable[[], None]], reps: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each function, the functions taking turns within every repetition,
    so that a slow phase of the machine hits all of them alike and their ratios stay meaningful."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for rep in range(warmup + reps):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            if rep >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def machine_line() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads")


def status_bytes(field: str) -> int:
    """VmRSS / VmHWM (peak RSS) of this process from /proc; unlike ru_maxrss, VmHWM starts afresh at
    exec, so it is not the parent's peak."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024
