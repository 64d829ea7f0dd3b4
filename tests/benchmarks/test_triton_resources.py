"""The fused kernels compile for Hopper (sm_90, Triton's own ptxas) on a machine without a GPU: what the interpreter
accepts, the GPU compiler must too, and a GPU session is too short to find out there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


def test_every_kernel_compiles_for_sm90_with_the_first_tiling(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    output = tmp_path / "resources.md"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "triton_resources.py"), "--tilings",
                             "64x32x4x2", "--output", str(output)], capture_output=True, text=True, env=env,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in output.read_text().splitlines() if line.startswith("| ") and "64 x 32" in line]
    assert [row.split(" | ")[0].strip("| ") for row in rows] == ["forward"] * 2 + ["query"] * 2 + ["key"] * 2
