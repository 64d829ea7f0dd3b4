"""The command line answers `--help` and `presets` without importing torch, transformers or datasets."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from convattn.commands.presets import count_parameters, precomputed_counts
from convattn.presets import preset_names

SRC = Path(__file__).resolve().parents[2] / "src"
HEAVY = ("torch", "transformers", "datasets")


def imported_modules(*args: str) -> set[str]:
    """Top-level modules imported by `python -m convattn ARGS`, from `-X importtime`'s report."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "convattn", *args], capture_output=True,
                          text=True, env=env, check=True)
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in lines}


@pytest.mark.parametrize("args", [("--help",), ("presets",), ("presets", "--no-count")])
def test_listing_commands_import_no_heavy_library(args):
    modules = imported_modules(*args)
    assert "convattn" in modules  # the report is read correctly
    assert not modules & set(HEAVY)


@pytest.mark.slow
def test_precomputed_parameter_counts_match_built_models():
    counts = precomputed_counts()
    assert sorted(counts) == sorted(preset_names())
    for name in preset_names():
        assert counts[name] == count_parameters(name), name


@pytest.mark.slow
def test_library_import_still_registers_the_auto_classes():
    code = "import convattn, transformers; print(type(transformers.AutoConfig.for_model('convattn')).__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.stdout.strip() == "ConvAttnConfig"


def test_an_unexpected_error_is_one_line_and_a_traceback_file(monkeypatch, capsys):
    from convattn.cli import main
    from convattn.commands import presets

    def broken(args):
        raise RuntimeError("something inside broke\nsecond line")

    monkeypatch.setattr(presets, "run", broken)
    monkeypatch.setattr(presets, "add_arguments", lambda parser: parser.set_defaults(func=broken, loads_models=False))
    assert main(["presets"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("convattn presets: unexpected error: RuntimeError: something inside broke")
    assert "\n" not in err
    traceback_file = Path(err.rsplit("full traceback: ", 1)[1].rstrip(")"))
    assert "Traceback" in traceback_file.read_text() and "second line" in traceback_file.read_text()
    traceback_file.unlink()
