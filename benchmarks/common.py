"""Timing and memory helpers shared by the benchmarks (not by the library)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


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


def saved_activation_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes of tensors autograd keeps for backward while running `fn` (deduplicated by storage).

    This is the activation memory of a training step, exact and repeatable on CPU, where
    allocator peaks are not observable without a fresh process. The graph is only measured, never
    run backward. The saved tensors are held here, outside the graph, until the forward ends (so no
    storage is freed and its address reused); packing them into the graph instead would tie saved
    outputs to their own grad_fn in a reference cycle that autograd cannot free."""
    held: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> None:
        held[t.untyped_storage().data_ptr()] = t

    def unpack(_) -> torch.Tensor:
        raise RuntimeError("saved_activation_bytes builds a graph for measurement only; it cannot run backward")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        fn()
    total = sum(t.untyped_storage().nbytes() for t in held.values())
    held.clear()
    return total


def machine_line() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads")


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
