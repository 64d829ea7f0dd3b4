"""A pytest plugin (`-p cuda_selection`, benchmarks/ on the path) for the GPU call's tests stage (issue 62): the
kernel's tests a GPU runs, the ones the call's bars rely on first.

    --cuda-selection   drop the tests whose skip marks skip them on this machine (`skip`, and `skipif` with a
                       condition that is True: the tests' own DEVICE checks), and order the rest BARS_FIRST first
    --as-cuda          collect as a GPU would: torch.cuda.is_available() answers True while the test modules import,
                       so that their marks read DEVICE == "cuda". For --collect-only on a CPU (nothing can run)
    --selection-file   with --cuda-selection: write the selection's node ids there, one a line, in order, as soon
                       as it is collected (named even where the run is stopped)
    --bars-first       only order the tests given, BARS_FIRST first (the rehearsal's run of the GPU's selection)
    --outcomes-file    append each test's outcome there as it ends, a JSON line: its node id, passed / failed /
                       skipped, and a failure's message (its exception's type and message), so that a run stopped at its
                       deadline still says which tests failed and why

On a CPU, `pytest --collect-only -q -p cuda_selection --as-cuda --cuda-selection FILES` names the GPU's selection
(gpu_session.py's rehearsal resolves it so); on the GPU the same options without --as-cuda run it in that order.
A test that skips itself inside its body cannot be read from its marks: the kernel's tests mark their cases.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# what each bar stands on, in the call's order: the relative terms with padding (composite and composite+key), ALiBi
# computed inside the kernel (never yet compiled for a GPU, and not in the gate), dropout's replay, the timed dtype
# (bf16), the dQ accumulators' determinism (the backward's read-add-write: a race would show here), then the CUDA
# graphs the training stage's graphs rows replay. The plain kernel's own case runs under the interpreter only; the
# gate checks it on the GPU
BARS_FIRST = (
    "test_every_term_combination_matches_the_reference_with_padding",
    "test_padding_anywhere_and_keys_past_the_last_real_one",
    "test_alibi_matches_the_reference_with_padding_anywhere",
    "test_dropout_is_replayed_in_backward",
    "test_half_precision_against_float32",
    "test_repeated_calls_compute_the_same_bits",
    "test_two_backward_passes_give_the_same_bits",
    "test_the_backward_sums_any_number_of_splits_to_the_reference",
    "test_triton_cuda_graphs.py",
)


def pytest_addoption(parser):
    group = parser.getgroup("cuda_selection", "the GPU call's selection of the kernel's tests")
    group.addoption("--cuda-selection", action="store_true",
                    help="deselect the tests this machine's skip marks skip; the bars' tests first")
    group.addoption("--as-cuda", action="store_true",
                    help="collect as on a GPU (torch.cuda.is_available() is True): for --collect-only on a CPU")
    group.addoption("--selection-file", help="with --cuda-selection: write the selection's node ids here")
    group.addoption("--bars-first", action="store_true", help="order the tests, the bars' first; deselect none")
    group.addoption("--outcomes-file", help="append each test's outcome here as a JSON line, as it ends")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if config.getoption("outcomes_file") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Outcomes(config.getoption("outcomes_file")), "cuda_selection_outcomes")
    if config.getoption("as_cuda"):
        if not config.getoption("collectonly"):
            raise pytest.UsageError("--as-cuda only collects: nothing can run as on a GPU without one")
        import torch

        torch.cuda.is_available = lambda: True  # before the test modules import (collection comes after)


def skipped(item) -> bool:
    """Whether the item's marks skip it here: a `skip`, or a `skipif` with a condition that is True (a string
    condition, which pytest evaluates later, is not read: the item stays)."""
    for mark in item.iter_markers():
        if mark.name == "skip":
            return True
        if mark.name == "skipif":
            conditions = [*mark.args, *([mark.kwargs["condition"]] if "condition" in mark.kwargs else [])]
            if any(condition is True for condition in conditions):
                return True
    return False


def rank(nodeid: str) -> int:
    """The item's place in BARS_FIRST (by the first name its node id holds); after them all where it holds none."""
    return next((place for place, name in enumerate(BARS_FIRST) if name in nodeid), len(BARS_FIRST))


def pytest_collection_modifyitems(session, config, items):
    if config.getoption("bars_first"):
        items.sort(key=lambda item: rank(item.nodeid))  # stable: each test's cases keep their order
    if not config.getoption("cuda_selection"):
        return
    kept = [item for item in items if not skipped(item)]
    dropped = [item for item in items if skipped(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    kept.sort(key=lambda item: rank(item.nodeid))
    items[:] = kept
    listing = config.getoption("selection_file")
    if listing:  # whole or not at all (several xdist workers write the same list)
        staged = Path(f"{listing}.{os.getpid()}.tmp")
        staged.write_text("".join(f"{item.nodeid}\n" for item in kept))
        staged.replace(listing)


MESSAGE_CHARS = 600  # a failure's message is kept to its first this many characters


def failure_message(report) -> str:
    """Why a report failed: the exception pytest's crash line names (type and message), else the error's "E" lines."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message[:MESSAGE_CHARS]
    said = [line[1:].strip() for line in str(report.longrepr).splitlines() if line.startswith("E ")]
    return "\n".join(said or str(report.longrepr).splitlines()[-1:])[:MESSAGE_CHARS]


class Outcomes:
    """With --outcomes-file, one JSON line per test as it ends: its call, or its set-up where that failed or skipped
    it, and a teardown only where it failed. Registered in the controller only where pytest-xdist runs workers (the
    workers' reports reach it)."""

    def __init__(self, path: str):
        self.path = path

    def pytest_runtest_logreport(self, report):
        if report.when != "call" and report.outcome == "passed":
            return
        line = {"test": report.nodeid, "when": report.when, "outcome": report.outcome}
        if report.failed:
            line["message"] = failure_message(report)
        with open(self.path, "a") as sink:  # a line at a time: a run killed at its deadline keeps what ended before
            sink.write(json.dumps(line) + "\n")
