"""Every benchmark script still imports what it uses from the library and parses its flags: they run on a lent
GPU machine, where finding a broken import costs device time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# modules the scripts import, not scripts: gpu_session.py --help imports pretrain_step
MODULES = ("common.py", "pretrain_step.py")
SCRIPTS = sorted(path.name for path in BENCHMARKS.glob("*.py") if path.name not in MODULES)


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_starts(script):
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
