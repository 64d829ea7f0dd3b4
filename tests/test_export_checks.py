"""`convattn export` refuses what it cannot write well, in one line and exit 2, and never leaves a partial file."""

from __future__ import annotations

import errno
import importlib.util
import shutil
from pathlib import Path

import pytest
from helpers.damage import config_with, foreign_bert, nan_weights, pickle_only
from helpers.tiny import save_tiny_mlm

from convattn.cli import main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("onnxscript") is None or
                                importlib.util.find_spec("onnx") is None, reason="needs the [onnx] extra")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    return save_tiny_mlm(tmp_path_factory.mktemp("export") / "model")


@pytest.fixture
def model(saved, tmp_path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "model"))


def export(model: Path, onnx: Path, *extra: str) -> int:
    return main(["export", str(model), "--onnx", str(onnx), *extra])


def assert_refused(code: int, err: str, fragment: str) -> None:
    assert code == 2, err
    assert err.strip().startswith("convattn export: error: ") and len(err.strip().splitlines()) == 1, err
    assert fragment in err


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "model")


@pytest.mark.parametrize(("extra", "message"), [
    (["--opset", "0"], "--opset 0 is not one the installed ONNX exporter writes: give 18 to"),
    (["--opset", "999"], "--opset 999 is not one"),
    (["--opset", "-5"], "--opset -5 is not one"),
])
def test_an_opset_outside_the_exporters_range_is_refused(model, tmp_path, capsys, extra, message):
    assert_refused(export(model, tmp_path / "m.onnx", *extra), capsys.readouterr().err, message)
    assert leftovers(tmp_path) == []


def test_an_onnx_path_that_is_a_folder_or_under_a_file_is_refused(model, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    assert_refused(export(model, tmp_path / "out"), capsys.readouterr().err, "is a folder")
    (tmp_path / "file").write_text("mine")
    assert_refused(export(model, tmp_path / "file" / "m.onnx"), capsys.readouterr().err, "is a file")
    assert leftovers(tmp_path) == ["file", "out"] and not any((tmp_path / "out").iterdir())


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, a folder that takes no new folders")
def test_an_onnx_path_whose_folder_cannot_be_made_is_one_line(model, capsys):
    # /proc looks writable to root, so the folder's making failed later, as a bare errno
    assert_refused(export(model, Path("/proc/convattn-x/m.onnx")), capsys.readouterr().err,
                   "--onnx /proc/convattn-x/m.onnx: /proc/convattn-x cannot be made (No such file or directory); "
                   "give a folder on a filesystem you can write to")


def test_an_onnx_path_over_another_file_is_refused(model, tmp_path, capsys):
    """No export writes over one of its inputs (the model's weights) or a file that is not a graph."""
    weights = model / "model.safetensors"
    before = weights.read_bytes()
    assert_refused(export(model, weights), capsys.readouterr().err, "is an existing file that is not an ONNX graph")
    assert weights.read_bytes() == before


@pytest.mark.parametrize(("damage", "message"), [
    (nan_weights, "non-finite (NaN or infinite) weights"),
    (lambda f: config_with(f, not_a_field=1), "fields convattn does not know: not_a_field"),
    (lambda f: config_with(f, attention_probs_dropout_prob=float("nan")), "must be a finite number"),
    (lambda f: (f / "config.json").write_text("not json"), "is not JSON"),
    (pickle_only, "safetensors only"),
    (lambda f: (f / "model.safetensors").write_bytes(b""), "truncated or corrupt"),
    (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:500]),
     "truncated or corrupt"),
    (lambda f: (f / "model.safetensors").write_bytes(b"garbage" * 100), "truncated or corrupt"),
    (lambda f: config_with(f, intermediate_size=48), "has shape [64] in the file but the config asks for [48]"),
    (foreign_bert, "is a transformers bert model, not a convattn model"),
])
def test_bad_model_folders_are_refused(model, tmp_path, capsys, damage, message):
    damage(model)
    assert_refused(export(model, tmp_path / "m.onnx"), capsys.readouterr().err, message)
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_a_failed_write_leaves_no_temporary_file(model, tmp_path, capsys, monkeypatch):
    from torch.onnx import ONNXProgram

    def disk_full(self, destination, *args, **kwargs):
        Path(destination).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ONNXProgram, "save", disk_full)
    assert_refused(export(model, tmp_path / "m.onnx"), capsys.readouterr().err, "No space left on device")
    assert leftovers(tmp_path) == []


def test_a_folder_another_convattn_process_writes_is_refused(model, tmp_path, capsys):
    """export takes the lock every writing command takes, on the folder it writes into: not a run folder being
    written, nor the same file by another export; nothing is written and the lock's holder is named."""
    import os

    from convattn.runs.folder import LOCK_FILE, run_folder_lock

    busy = tmp_path / "busy"
    with run_folder_lock(busy):
        code = export(model, busy / "m.onnx")
        err = capsys.readouterr().err
        assert_refused(code, err, "in use by another convattn run")
        assert f"pid {os.getpid()}" in err
        assert [p.name for p in busy.iterdir()] == [LOCK_FILE]
    assert not busy.exists()  # the holder wrote nothing: no trace left


@pytest.mark.slow
def test_an_export_leaves_no_lock_behind(model, tmp_path, capsys):
    out = tmp_path / "graphs" / "m.onnx"
    assert export(model, out) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.onnx"]
