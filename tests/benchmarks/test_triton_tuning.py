"""benchmarks/triton_tuning.py, the second call of a GPU session: rehearsed end to end on CPU (tiny shapes, the
kernel under Triton's interpreter), so that its stages and every tiling it forces still run when a GPU comes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("triton")
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
def test_the_rehearsal_runs_every_stage_and_every_forced_tiling(tmp_path, benchmark_rows):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    # a deadline an hour away: the default five minutes left the rehearsal unfinished on a machine loaded 4x over
    result = subprocess.run([sys.executable, str(BENCHMARKS / "triton_tuning.py"), "--rehearse", "--out",
                             str(tmp_path), "--deadline", str(time.time() + 3600)], capture_output=True, text=True,
                            timeout=3600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert {path.name for path in tmp_path.iterdir()} == {"tuning.json", "tuning.md", "host_profile.txt"}
    results = json.loads((tmp_path / "tuning.json").read_text())
    assert results["failed"] == {} and "unfinished" not in results
    assert [row["problem"] for row in results["ladder"]] == ["plain", "dropout", "padding", "padding+row",
                                                             "padding+row+key", "composite+key"]
    timed = {(row["problem"], row["kernel"]) for row in results["tilings"]}
    assert timed == {(problem, kernel) for problem in ("plain", "composite+key")
                     for kernel in ("forward", "backward")}
    assert all(row["ms"] > 0 for row in results["tilings"])
    # the run's row, its figures those of tuning.json
    row = json.loads((benchmark_rows / "triton_tuning.jsonl").read_text())
    assert row["command"].startswith("python benchmarks/triton_tuning.py --rehearse")
    assert sum(figure["stage"] == "tilings" for figure in row["figures"]) == len(results["tilings"])


def test_rehearsing_without_the_interpreter_is_refused(tmp_path, monkeypatch, capsys):
    import triton_tuning  # in this process: the refusal comes from its flags, before anything runs

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(sys, "argv", ["triton_tuning.py", "--rehearse", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as refused:
        triton_tuning.main()
    assert refused.value.code == 2 and "TRITON_INTERPRET=1" in capsys.readouterr().err


def test_each_sweep_starts_with_the_tilings_the_library_tries(monkeypatch):
    """The sweep times what the autotuner would pick from on a GPU (half precision, 64 channels), then alternatives:
    a tiling list changed in the library and not here would leave its picks untimed."""
    import torch

    from convattn.attention.relative.triton import launch

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import triton_tuning
    finally:
        sys.path.remove(str(BENCHMARKS))
    monkeypatch.setattr(launch, "interpreting", lambda: False)
    for kernel in triton_tuning.KERNELS:
        library = launch.configs(kernel, 64, torch.bfloat16)
        swept = triton_tuning.TILINGS[kernel]
        assert swept[:len(library)] == library and len(set(swept)) == len(swept), kernel
