"""benchmarks/gpu_session.sh, a GPU session's one call: rehearsed end to end on CPU (tiny shapes, the kernel under
Triton's interpreter), and a stage's bookkeeping when an arm breaks the CUDA context or time runs out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def gpu_session():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import gpu_session

        yield gpu_session
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.slow
def test_the_rehearsal_runs_every_stage_and_prints_the_summary_last(tmp_path):
    result = subprocess.run(["bash", str(BENCHMARKS / "gpu_session.sh"), "--rehearse"], capture_output=True,
                            text=True, timeout=600, env={**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert {path.name for path in tmp_path.iterdir()} == {
        "session.log", "tests.json", "layer.json", "encoder.json", "profile.json", "summary.md"}
    for stage in ("tests", "layer", "encoder", "profile"):
        assert "exit 0" in next(line for line in result.stdout.splitlines() if f"stage {stage}:" in line)
    layer = json.loads((tmp_path / "layer.json").read_text())["rows"]
    assert {row["arm"] for row in layer} == {"sdpa", "triton", "decomposed", "dense"}
    kernel = (BENCHMARKS.parent / "src/convattn/attention/relative/triton_attention.py").exists()
    measured = [row for row in layer if kernel or row["arm"] != "triton"]
    assert all(row.get("ms", 0) > 0 for row in measured), [row for row in measured if "error" in row]
    tests = json.loads((tmp_path / "tests.json").read_text())["rows"]
    assert tests[0]["rc"] in (0, 5), tests  # 5: the selection (CUDA tests) holds none that run here
    summary = (tmp_path / "summary.md").read_text()
    assert result.stdout.rstrip().endswith(summary.split("\n## Every layer row")[0].rstrip())
    assert "## Layer bars" in summary and "## Encoder" in summary and "## Where a layer step's time goes" in summary


def test_a_stage_goes_on_past_a_broken_context_without_that_arm_and_records_what_time_left_out(gpu_session,
                                                                                               tmp_path, monkeypatch):
    rows = [dict(n=n, arm=arm) for n in (1, 2) for arm in ("triton", "sdpa")]

    def measure(row, plan, deadline):
        if row["arm"] == "triton":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return {"ms": 1.0}
    monkeypatch.setitem(gpu_session.STAGES, "layer", (lambda plan: rows, measure))
    monkeypatch.setattr(gpu_session, "context_lost", lambda plan: True)
    plan, file = gpu_session.REHEARSAL, tmp_path / "layer.json"

    assert gpu_session.run_stage("layer", plan, tmp_path, time.time() + 60) == gpu_session.RESTART
    assert gpu_session.run_stage("layer", plan, tmp_path, time.time() + 60) == 0  # the session's restart
    recorded = json.loads(file.read_text())["rows"]
    assert [row.get("ms") or row["error"].split(":")[0] for row in recorded] == [
        "failed", 1.0, "skipped", 1.0]
    assert recorded[0]["context_lost"] and "illegal memory access" in recorded[0]["error"]

    file.unlink()
    assert gpu_session.run_stage("layer", plan, tmp_path, time.time() - 1) == 0
    assert {row["error"] for row in json.loads(file.read_text())["rows"]} == {
        "not measured: the stage ran out of time"}
