"""benchmarks/real_scale.py, the real-scale run's driver, end to end on CPU with a tiny model (--smoke): the kit is
packed from the shared data, unpacked, and the comparison runs (and continues when interrupted) until finished."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "real_scale.py"
SHARED = ROOT.parent / "shared" / "data"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared data not found at {SHARED}")]


def load_script():
    spec = importlib.util.spec_from_file_location("real_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def real_scale():
    return load_script()


@pytest.fixture
def script(real_scale, monkeypatch, capsys):
    """`python benchmarks/real_scale.py ARGS` called in this process: main()'s exit status and what it printed. The
    comparison and the fine-tuning still run as the `convattn` processes the script starts; the script's own start as
    `__main__` is test_scripts.py's."""
    def call(*args: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
        code = real_scale.main()
        return code, capsys.readouterr().out
    return call


def test_the_kit_packs_the_models_come_back_and_glue_runs_on_them(tmp_path, real_scale, script, monkeypatch):
    kit, work, out, results = tmp_path / "kit", tmp_path / "work", tmp_path / "out", tmp_path / "results"
    # the kit's archives at xz's fastest preset, which trades only size for time (the models' own preset stays)
    monkeypatch.setattr(real_scale, "write_tar", functools.partial(real_scale.write_tar, preset=0))
    packed, said = script("pack", "--kit", str(kit), "--text-mb", "1", "--vocab-size", "1000", "--no-wheels")
    assert packed == 0, said
    assert {p.name for p in kit.iterdir()} == {".real_scale-kit", "corpus.tar.xz", "eval.tar.xz", "tokenizer"}

    run = ["run", "--kit", str(kit), "--work", str(work), "--out", str(out), "--smoke", "--budget", "2s"]
    # a first call stopped early says so and leaves a status; the same command continues it. The comparison outlasts
    # --stop-after on a fast machine too: the process's start, then each model's --budget of training compute with
    # its evaluations and checkpoints on top
    first, said = script(*run, "--stop-after", "6")
    status = json.loads((out / "real_scale.json").read_text())
    assert first in (0, 3), said
    assert status["finished"] == (first == 0)
    assert (first == 0) == (said.splitlines()[-1] == "real_scale: finished")
    for _ in range(5):
        if status["finished"]:
            break
        _, said = script(*run, "--stop-after", "300")
        status = json.loads((out / "real_scale.json").read_text())
    assert status["finished"], said + (work / "compare.log").read_text()[-3000:]
    assert sorted((work / "corpus").iterdir())  # unpacked once, reused by every call

    rows = ["chang2021-small--absolute", "chang2021-small--composite"]
    assert status["models"] == rows
    brought = sorted(p.name for p in out.iterdir())
    assert brought == sorted(["compare.log", "real_scale.json", "report.md", *(f"{row}.tar.xz.part00" for row in rows)])
    assert len(brought) <= 8 and all((out / name).stat().st_size <= 16 * 2**20 for name in brought)
    report = (out / "report.md").read_text()
    for preset in ("chang2021-small/absolute", "chang2021-small/composite"):
        assert preset in report
    assert status["command"][2:4] == ["compare", "--presets"]
    assert "--time-budget" in status["command"] and "--glue" not in status["command"]

    glue = ["glue", "--models", str(out), "--work", str(work), "--out", str(results), "--tasks", "cola", "--seeds",
            "1", "--max-steps", "2"]
    finetuned, said = script(*glue)
    assert finetuned == 0, said
    table = (results / "glue.md").read_text()
    assert all(f"| {row} | " in table for row in rows) and "CoLA" in table
    # the weights came back in bfloat16 and go to fine-tuning in float32, each unpacked once: a call again (after a
    # kill, say) takes the models as they are (`convattn glue` reusing its finished seeds is test_glue.py's)
    models = work / "models"
    weights = load_file(models / rows[1] / "model.safetensors")
    assert {tensor.dtype for tensor in weights.values()} == {torch.float32}
    unpacked = {path: path.stat().st_mtime_ns for path in models.rglob("*")}
    assert real_scale.join_models(out, models) == [models / row for row in rows]
    assert {path: path.stat().st_mtime_ns for path in models.rglob("*")} == unpacked


def test_a_model_comes_back_in_parts_that_join_to_the_same_bytes(tmp_path, monkeypatch):
    real_scale = load_script()
    monkeypatch.setattr(real_scale, "PART_BYTES", 1000)
    archive = tmp_path / "row.tar.xz"
    archive.write_bytes(bytes(range(256)) * 10)  # 2,560 bytes: three parts
    out = tmp_path / "out"
    out.mkdir()
    (out / "row.tar.xz.part07").write_text("stale")
    real_scale.split(archive, out)
    parts = sorted(p.name for p in out.iterdir())
    assert parts == ["row.tar.xz.part00", "row.tar.xz.part01", "row.tar.xz.part02"]
    assert b"".join((out / name).read_bytes() for name in parts) == archive.read_bytes()


def test_pack_leaves_a_folder_it_did_not_make_alone(tmp_path, script):
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "mine.json").write_text("{}")
    with pytest.raises(SystemExit, match="did not write"):  # sys.exit(message): exit status 1, the message on stderr
        script("pack", "--kit", str(tmp_path), "--text-mb", "1", "--vocab-size", "1000", "--no-wheels")
    assert (tmp_path / "tokenizer" / "mine.json").read_text() == "{}"


def test_run_refuses_a_missing_kit(tmp_path, script):
    with pytest.raises(SystemExit, match="pack"):
        script("run", "--kit", str(tmp_path / "none"), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
               "--smoke")
