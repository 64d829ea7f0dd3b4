"""The fused kernel's tilings for the GPU call (issue 62): one pinned at a time, and compiled without a launch.

    pinned_tiling(i)   the kernel's autotuners hold only their i-th tiling (the last where a kernel has fewer): the
                       gate checks each tiling the stages' autotuners may pick, and a warm-up process compiles one
    compile_only()     every launch of the kernel's package becomes the kernel's `warmup`: Triton compiles for the
                       launch's own arguments (their specialisation included) into its cache and launches nothing;
                       under the interpreter a warmup does nothing at all
    tiling_count()     how many tilings the autotuners try for the call's dtype and head size (1 under the interpreter)
    launches()         the kernel's launches made inside, counted (compile_only's included)

The package's names these lean on (launch.configs, launch.autotuned, launch.AUTOTUNERS) are read when used: where its
rework renames them, pinned_tiling raises TilingsUnknown and its callers say so in their rows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class TilingsUnknown(RuntimeError):
    """The kernel's package no longer has the names a tiling is pinned through."""


def _launch():
    from convattn.attention.relative.triton import launch

    missing = [name for name in ("configs", "autotuned", "AUTOTUNERS") if not hasattr(launch, name)]
    if missing or not hasattr(launch.autotuned, "cache_clear"):
        raise TilingsUnknown(f"the kernel's launch module has no {', '.join(missing) or 'autotuned.cache_clear'}")
    return launch


def tiling_count(head_dim: int, dtype) -> int:
    """The most tilings any autotuned kernel tries at this head size and dtype."""
    launch = _launch()
    return max(len(launch.configs(kernel, head_dim, dtype)) for kernel in ("forward", "backward"))


def _forget(launch) -> None:
    launch.autotuned.cache_clear()
    launch.AUTOTUNERS.clear()


@contextlib.contextmanager
def pinned_tiling(index: int) -> Iterator[None]:
    """Inside, every autotuner the kernel makes holds one tiling: its `index`-th (its last where it has fewer)."""
    launch = _launch()
    original = launch.configs

    def pinned(kernel, head_dim, dtype):
        tilings = original(kernel, head_dim, dtype)
        return [tilings[min(index, len(tilings) - 1)]]

    launch.configs = pinned
    _forget(launch)  # the autotuners made before hold every tiling
    try:
        yield
    finally:
        launch.configs = original
        _forget(launch)


class _Warm:
    """What launch.wrapped returns inside compile_only: kernel[grid](...) compiles, launches nothing."""

    def __init__(self, kernel, compiled: list):
        self.kernel, self.compiled = kernel, compiled

    def __getitem__(self, grid):
        def warm(*args, **kwargs):
            name = getattr(self.kernel, "__name__", None) or getattr(getattr(self.kernel, "fn", None), "__name__", "?")
            start = time.perf_counter()
            self.kernel.warmup(*args, grid=grid, **kwargs)
            self.compiled.append((name, round(time.perf_counter() - start, 2)))
        return warm


@contextlib.contextmanager
def _launching_through(replace) -> Iterator[None]:
    """Inside, every launch of the kernel's package (launch.wrapped, eager and traced) goes through
    replace(kernel, original): the one place the package's launches are intercepted."""
    from convattn.attention.relative.triton import launch

    original = launch.wrapped
    launch.wrapped = lambda kernel: replace(kernel, original)
    try:
        yield
    finally:
        launch.wrapped = original


@contextlib.contextmanager
def compile_only() -> Iterator[list]:
    """Inside, the kernel's launches compile and launch nothing; yields the list of (kernel, seconds) compiled so
    far. The outputs stay as allocated: only their shapes mean anything."""
    compiled: list = []
    with _launching_through(lambda kernel, original: _Warm(kernel, compiled)):
        yield compiled


@contextlib.contextmanager
def launches() -> Iterator[list]:
    """Inside, yields a list holding each kernel the package launches (compile_only's warm-ups too): whether a model
    took the kernel is read from what it ran, not from its attn_implementation's name, which on a GPU is SDPA's
    for a model whose relative terms take the kernel by default."""
    launched: list = []
    with _launching_through(lambda kernel, original: launched.append(kernel) or original(kernel)):
        yield launched
