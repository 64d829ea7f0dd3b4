"""Without a GPU, Triton kernels run under Triton's interpreter on CPU tensors. The variable is read when a kernel
is defined (`triton.jit`), so it is set before any test module imports one.

The fast tier (`pytest -m "not slow"`) is every test not marked `slow`; a test over SLOW_S seconds (its set-up,
call and tear-down) that is not marked is named at the end of the run, so the tier stays fast as tests are added.
The report names it and fails nothing: the seconds depend on the machine's load.

Tests run on one intra-op thread (OMP_NUM_THREADS, unless set), and so do the processes they start: their matrices
are tiny, and on 2 shared cores with two test processes OpenMP's threads spin-wait against each other (a tiny
pretraining run's file took twice the CPU time and wall time on the machine's 2 threads)."""

import os
from collections import defaultdict

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported, for this process and the ones it starts

import pytest
import torch
from helpers.clock import StepClock

if os.environ["OMP_NUM_THREADS"].isdigit():  # should a plugin have imported torch first
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

SLOW_S = 30
SECONDS = defaultdict(float)  # an unmarked test's seconds, by node id


def pytest_runtest_logreport(report):
    """Under pytest-xdist this runs in the controlling process, with each worker's reports."""
    if "slow" not in report.keywords:
        SECONDS[report.nodeid] += report.duration


def pytest_terminal_summary(terminalreporter):
    over = sorted(((s, nodeid) for nodeid, s in SECONDS.items() if s > SLOW_S), reverse=True)
    if over:
        terminalreporter.section(f"tests over {SLOW_S} s not marked slow")
        for seconds, nodeid in over:
            terminalreporter.write_line(f"{seconds:.1f}s {nodeid}")
        terminalreporter.write_line('mark them @pytest.mark.slow (or make them quicker): the fast tier, -m "not '
                                    'slow", runs every unmarked test')


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """A test that changes torch's thread count gives it back, so no test runs under another's (test_hub compares
    logits with a subprocess bit for bit, and matrix products split across threads sum in another order)."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_progress_bars():
    """Progress bars off in every test, as a command leaves them (`console.configure`): otherwise a test's stderr
    held transformers' "Writing model shards" bar only where no command had run before it in its process (a foreign
    BERT saved inside test_plot_checks, first in its worker, failed its one-line check)."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    yield


@pytest.fixture(autouse=True)
def keep_denormals():
    """A test that flushes denormal floats (the command line does, and a benchmark's parser) gives the state back, so
    no test computes under another's (convattn.denormals)."""
    from convattn.denormals import denormals_flushed, set_denormals

    flushed = denormals_flushed()
    yield
    if denormals_flushed() != flushed:
        set_denormals(flushed)


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
