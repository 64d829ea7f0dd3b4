"""Every benchmark script still imports what it uses from the library and parses its flags: they run on a lent
GPU machine, where finding a broken import costs device time.

One subprocess runs every script's `--help` as `python SCRIPT --help` would (run as `__main__`, its folder first
on sys.path), so torch and transformers are imported once instead of once per script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a subprocess importing every benchmark
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# modules the scripts import, not scripts: harness.py (what every benchmark shares); gpu_session.py --help imports
# pretrain_step, gpu_gate and kernel_tilings; cuda_selection is the tests stage's pytest plugin
# (tests/benchmarks/test_gpu_session.py loads it)
MODULES = ("harness.py", "pretrain_step.py", "gpu_gate.py", "kernel_tilings.py", "cuda_selection.py")
SCRIPTS = sorted(path.name for path in BENCHMARKS.glob("*.py") if path.name not in MODULES)

EACH_HELP = """
import contextlib, io, json, runpy, sys, traceback

folder, scripts = sys.argv[1], sys.argv[2:]
sys.path.insert(0, folder)
answers = {}
for script in scripts:
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [f"{folder}/{script}", "--help"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
            if isinstance(exit.code, str):
                print(exit.code, file=sys.stderr)
        except BaseException:
            code = 1
            traceback.print_exc()
    answers[script] = {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, dict]:
    result = subprocess.run([sys.executable, "-c", EACH_HELP, str(BENCHMARKS), *SCRIPTS], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_starts(script, helps):
    answer = helps[script]
    assert answer["returncode"] == 0, answer["stderr"][-2000:]
    assert "usage:" in answer["stdout"]
