"""Timing and memory helpers shared by the benchmarks (not by the library)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def time_fn(fn: Callable[[], None], reps: int, warmup: int = 1) -> float:
    """Median wall time of `fn` in seconds after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def saved_activation_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes of tensors autograd keeps for backward while running `fn` (deduplicated by storage).

    This is the activation memory of a training step, exact and repeatable on CPU, where
    allocator peaks are not observable without a fresh process."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


def machine_line() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads")


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
