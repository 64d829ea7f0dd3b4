"""What every benchmark test runs under: the rows a benchmark appends (benchmarks/harness.py's Run) go to the test's
own folder, never to the checkout's benchmarks/results/, for the benchmark's process and those it starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# a script loaded from its file (importlib) imports harness as `python benchmarks/x.py` would: from its own folder
BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)


@pytest.fixture(autouse=True)
def benchmark_rows(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.mktemp("benchmark-rows")  # beside the test's tmp_path, whose files tests count
    monkeypatch.setenv("CONVATTN_BENCHMARK_RESULTS", str(folder))
    return folder
