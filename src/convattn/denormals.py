"""Denormal floats on the CPU, flushed to zero in the command line's process.

A float32 below 2^-126 (about 1.2e-38; a float64 below 2^-1022) is denormal, and on x86 CPUs arithmetic on one can
take a microcode assist many times the cost of a normal operation. Attention makes them wherever a score sits 87 to
104 below its row's maximum (exp of it is denormal, then the products and matrix products that read it are slow):
ALiBi does so by design, its bias -m_h |i - j| reaching -128 at 512 tokens' distance for the steepest of 4 heads
(m_h = 1/4). On an Intel Xeon (2 threads) one ALiBi layer, forward and backward, took 4.7x plain SDPA's time at
n = 2,048 x 4 with denormals kept and 1.05x flushed (RESULTS 8.8, 8.9; measure again with `python
benchmarks/attention_layer.py --arms none,alibi --keep-denormals` against the same without the flag). Flushing
changes only values below those bounds, which become zero (as TensorFlow and oneDNN do by default).

x86's flags (flush-to-zero and denormals-are-zero, MXCSR) are per thread, and a thread starts with its creator's:
the command line sets them in its main thread before the first parallel region starts OpenMP's threads
(`flush_denormals`), so every thread of the run has them, and sets them back when it returns (an in-process caller
keeps its own). A library caller sets them the same way, first thing in its script: `torch.set_flush_denormal(True)`;
ALiBi on a CPU thread that keeps them says so once (`attention.relative.dispatch`).
"""

from __future__ import annotations

# the float types whose limits numpy computes (once, then cached): computed with denormals flushed, its smallest
# denormal reads as zero and numpy warns on every later use
_NUMPY_FLOATS = ("float16", "float32", "float64", "longdouble")


def denormals_flushed() -> bool:
    """Whether this thread reads and makes denormal floats as zero."""
    import torch

    smallest_half = torch.tensor([0x00400000], dtype=torch.int32).view(torch.float32)  # 2^-127, made from its bits
    return float(smallest_half * 4.0) == 0.0


def flush_denormals() -> bool:
    """Flush denormal floats to zero in this thread and in the threads it starts from now on; returns whether they
    were flushed before (for `set_denormals`). Where the CPU cannot (torch says so), nothing changes."""
    import numpy
    import torch

    before = denormals_flushed()
    for name in _NUMPY_FLOATS:
        numpy.finfo(getattr(numpy, name))
    torch.set_flush_denormal(True)
    return before


def set_denormals(flushed: bool) -> None:
    """Flush denormal floats in this thread, or keep them (`flush_denormals`' answer gives a caller's state back)."""
    import torch

    torch.set_flush_denormal(flushed)
