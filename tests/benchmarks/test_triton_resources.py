"""The fused kernels, every one of them, compile for Hopper (sm_90, Triton's own ptxas) on a machine without a GPU:
what the interpreter accepts, the GPU compiler must too, and a GPU session is too short to find out there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a subprocess, compiling for sm_90
def test_every_kernel_compiles_for_sm90_and_is_read_back(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    output = tmp_path / "resources.md"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "triton_resources.py"), "--tilings",
                             "64x32x4x2", "--variants", "plain,composite+key", "--output", str(output)],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.strip("| ").split(" | ") for line in output.read_text().splitlines()
            if line.startswith("| ") and "64 x 32" in line]
    assert [(row[0], row[4]) for row in rows] == [(kernel, variant) for kernel in ("forward", "backward")
                                                  for variant in ("plain", "composite+key")]
    for kernel, *_, registers, spilled, off_band, band, smem, spill_ops, band_spill_ops, wgmma in rows:
        assert 0 < int(registers) <= 255 and int(spilled) >= 0 and wgmma == "yes"
        assert 0 < int(smem) < int(off_band) <= int(band) * 1.1, kernel
        assert 0 <= int(spill_ops) < int(off_band) and 0 <= int(band_spill_ops) < int(band)
    # the kernels that stream rows: the tables projected from q and k, and dQ with the row table's share, too
    streaming = [line.strip("| ").split(" | ") for line in output.read_text().splitlines()
                 if line.startswith(("| backward_preprocess ", "| query_gradient ", "| tables "))]
    assert [(row[0], row[1]) for row in streaming] == [
        ("backward_preprocess", "plain"), ("backward_preprocess", "composite+key"), ("query_gradient", "plain"),
        ("query_gradient", "composite+key"), ("tables", "composite+key")]
    for kernel, _, registers, spilled in streaming:
        assert 0 < int(registers) <= 255 and int(spilled) == 0, kernel


def test_unknown_variants_are_refused_by_name(tmp_path, monkeypatch, capsys):
    import triton_resources  # in this process: the refusal comes from its flags, before anything compiles

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(sys, "argv", ["triton_resources.py", "--variants", "plain,bogus", "--output",
                                      str(tmp_path / "r.md")])
    with pytest.raises(SystemExit) as refused:
        triton_resources.main()
    assert refused.value.code == 2 and "--variants: unknown ['bogus']" in capsys.readouterr().err
    assert not (tmp_path / "r.md").exists()
