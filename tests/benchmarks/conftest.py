"""What every benchmark test runs under: the rows a benchmark appends (benchmarks/harness.py's Run) go to the test's
own folder, never to the checkout's benchmarks/results/, for the benchmark's process and those it starts."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def benchmark_rows(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.mktemp("benchmark-rows")  # beside the test's tmp_path, whose files tests count
    monkeypatch.setenv("CONVATTN_BENCHMARK_RESULTS", str(folder))
    return folder
