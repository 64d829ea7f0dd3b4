"""Without a GPU, Triton kernels run under Triton's interpreter on CPU tensors. The variable is read when a kernel
is defined (`triton.jit`), so it is set before any test module imports one."""

import os

import pytest
import torch
from helpers.clock import StepClock

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """A test that changes torch's thread count gives it back, so no test runs under another's (test_hub compares
    logits with a subprocess bit for bit, and matrix products split across threads sum in another order)."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture
def one_thread():
    """One intra-op thread: tiny matrices gain nothing from threads, and on 2 shared cores OpenMP spin-waits
    against other processes (~50x slower for the tiny fine-tuning runs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def step_clock(monkeypatch) -> StepClock:
    """Time-budget training on clocks the test controls, whatever the machine's load: every step takes 1/8 s of
    compute (a power of two, so budgets sum exactly) and 1/4 s on the wall clock; no step is slowed by other
    processes."""
    from convattn.training.pretrain.budget import StepMeter  # after TRITON_INTERPRET is set

    clock = StepClock(0.125)
    monkeypatch.setattr(StepMeter, "compute", staticmethod(clock))
    monkeypatch.setattr(StepMeter, "wall", staticmethod(StepClock(0.25)))
    monkeypatch.setattr(StepMeter, "waiting", staticmethod(lambda: None))
    return clock
