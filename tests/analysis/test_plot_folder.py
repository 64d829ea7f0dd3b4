"""`convattn plot kernels|attention` owns its --output-dir before writing, as every writing command does: the lock
(two writers are kept apart), and a folder holding anything but plot's own figures and log is refused, naming
what is there, with nothing written; plot's own figures are replaced."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from helpers.tiny import save_tiny_checkpoint

from convattn.cli import main
from convattn.runs.folder import LOCK_FILE, run_folder_lock


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("plot") / "model", ["the quick brown fox jumps ."] * 20,
                                "chang2021-small/composite+depthwise")


@pytest.fixture
def checkpoint(saved, tmp_path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "model"))


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("convattn plot: error: ") and "\n" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


FOREIGN = [  # what the folder holds -> named in the refusal
    pytest.param({"thesis.tex": "years of work"}, ["thesis.tex"], id="a user's file"),
    pytest.param({"notebooks/a.ipynb": "{}"}, ["notebooks/"], id="a user's folder"),
    pytest.param({"attention_maps.png": "mine", "my_plot.png": "mine"}, ["my_plot.png"], id="a user's figure"),
    pytest.param({"config.json": "{}", "model.safetensors": "x"}, ["config.json", "model.safetensors"],
                 id="a model folder"),
]


@pytest.mark.parametrize("kind", ["kernels", "attention"])
@pytest.mark.parametrize(("files", "named"), FOREIGN)
def test_a_folder_holding_other_files_is_refused_and_left_alone(checkpoint, tmp_path, capsys, kind, files, named):
    out = tmp_path / "figures"
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    before = snapshot(out)
    assert main(["plot", kind, str(checkpoint), "--output-dir", str(out)]) == 2
    one_error_line(capsys, "--output-dir", "not convattn plot's figures", *named)
    assert snapshot(out) == before and sorted(p.name for p in out.iterdir()) == sorted({n.split("/")[0]
                                                                                          for n in files})


@pytest.mark.parametrize("kind", ["kernels", "attention"])
def test_the_default_plots_folder_is_checked_too(checkpoint, capsys, kind):
    (checkpoint / "plots").mkdir()
    (checkpoint / "plots" / "notes.txt").write_text("mine")
    assert main(["plot", kind, str(checkpoint)]) == 2
    one_error_line(capsys, "notes.txt")
    assert [p.name for p in (checkpoint / "plots").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("kind", ["kernels", "attention"])
def test_plots_own_figures_are_replaced(checkpoint, tmp_path, kind):
    out = tmp_path / "figures"
    assert main(["plot", kind, str(checkpoint), "--output-dir", str(out)]) == 0
    first = snapshot(out)
    assert main(["plot", kind, str(checkpoint), "--output-dir", str(out)]) == 0  # plot's own files: replaced
    assert set(snapshot(out)) == set(first) and LOCK_FILE not in first


@pytest.mark.parametrize("kind", ["kernels", "attention"])
def test_a_folder_another_convattn_process_writes_is_refused(checkpoint, tmp_path, capsys, kind):
    out = tmp_path / "busy"
    with run_folder_lock(out):
        assert main(["plot", kind, str(checkpoint), "--output-dir", str(out)]) == 2
        one_error_line(capsys, "in use by another convattn run", f"pid {os.getpid()}")
        assert [p.name for p in out.iterdir()] == [LOCK_FILE]
    assert not out.exists()
