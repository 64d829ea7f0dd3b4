"""benchmarks/real_scale.py, the real-scale run's driver, end to end on CPU with a tiny model (--smoke): the kit is
packed from the shared data, unpacked, and the comparison runs (and continues when interrupted) until finished."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "real_scale.py"
SHARED = ROOT.parent / "shared" / "data"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared data not found at {SHARED}")]


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_the_kit_packs_and_the_comparison_runs_to_the_end(tmp_path):
    kit, work, out = tmp_path / "kit", tmp_path / "work", tmp_path / "out"
    packed = script("pack", "--kit", str(kit), "--text-mb", "1", "--vocab-size", "1000", "--no-wheels")
    assert packed.returncode == 0, packed.stderr
    assert {p.name for p in kit.iterdir()} == {".real_scale-kit", "corpus.tar.xz", "eval.tar.xz", "tokenizer"}

    run = ["run", "--kit", str(kit), "--work", str(work), "--out", str(out), "--smoke", "--budget", "4s",
           "--glue", "cola", "--glue-seeds", "1", "--glue-max-train-samples", "64"]
    # a first call stopped early says so and leaves a status; the same command continues it
    first = script(*run, "--stop-after", "10")
    status = json.loads((out / "real_scale.json").read_text())
    assert first.returncode in (0, 3), first.stdout + first.stderr
    assert status["finished"] == (first.returncode == 0)
    assert (first.returncode == 0) == (first.stdout.splitlines()[-1] == "real_scale: finished")
    for _ in range(5):
        if status["finished"]:
            break
        again = script(*run, "--stop-after", "300")
        status = json.loads((out / "real_scale.json").read_text())
    assert status["finished"], again.stdout + again.stderr
    assert sorted((work / "corpus").iterdir())  # unpacked once, reused by every call

    report = (out / "report.md").read_text()
    for preset in ("chang2021-small/absolute", "chang2021-small/composite"):
        assert preset in report
    assert "CoLA" in report
    summary = (out / "summary.csv").read_text().splitlines()
    assert len(summary) == 3  # a header and the two rows
    assert status["command"][2:4] == ["compare", "--presets"]
    assert "--time-budget" in status["command"]


def test_pack_leaves_a_folder_it_did_not_make_alone(tmp_path):
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "mine.json").write_text("{}")
    result = script("pack", "--kit", str(tmp_path), "--text-mb", "1", "--vocab-size", "1000", "--no-wheels")
    assert result.returncode != 0
    assert "did not write" in result.stderr
    assert (tmp_path / "tokenizer" / "mine.json").read_text() == "{}"


def test_run_refuses_a_missing_kit(tmp_path):
    result = script("run", "--kit", str(tmp_path / "none"), "--work", str(tmp_path / "w"), "--out",
                    str(tmp_path / "o"), "--smoke")
    assert result.returncode != 0
    assert "pack" in result.stderr
