"""`convattn plot kernels|attention` checks the checkpoint folder before drawing: one line, exit 2, no figure."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.damage import config_with, foreign_bert, nan_weights, pickle_only
from helpers.tiny import save_tiny_mlm

from convattn.cli import main


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    return save_tiny_mlm(tmp_path_factory.mktemp("plot") / "model", "chang2021-small/composite+depthwise")


@pytest.fixture
def checkpoint(saved, tmp_path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "model"))


@pytest.mark.parametrize("kind", ["kernels", "attention"])
@pytest.mark.parametrize(("damage", "message"), [
    (nan_weights, "non-finite (NaN or infinite) weights"),
    (lambda f: config_with(f, extra_field=[1]), "fields convattn does not know: extra_field"),
    (lambda f: config_with(f, relative_reach=float("inf")), "relative_reach must be a finite number"),
    (lambda f: (f / "config.json").write_text("{"), "is not JSON"),
    (pickle_only, "safetensors only"),
    (lambda f: config_with(f, num_hidden_layers=1), "fit no part of this model"),
    (foreign_bert, "is a transformers bert model, not a convattn model; these plots read convattn's mechanisms"),
])
def test_bad_checkpoints_are_one_line_and_no_figure(checkpoint, capsys, kind, damage, message):
    damage(checkpoint)
    assert main(["plot", kind, str(checkpoint)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("convattn plot: error: ") and "\n" not in err and message in err
    assert not (checkpoint / "plots").exists()


def test_a_checkpoint_without_its_tokenizer_is_named_as_the_positional_argument(checkpoint, capsys):
    # the line said "--checkpoint DIR", a flag plot does not have
    code = main(["plot", "attention", str(checkpoint)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith(f"convattn plot: error: checkpoint {checkpoint}: cannot load a tokenizer from it (")
    assert err.endswith("save the tokenizer into it (tokenizer.save_pretrained)") and "--checkpoint" not in err


def test_a_checkpoint_that_is_not_a_folder_is_refused(checkpoint, capsys):
    assert main(["plot", "kernels", str(checkpoint / "config.json")]) == 2
    assert "is not a saved model directory" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["kernels", "attention"])
def test_an_output_dir_that_is_a_file_is_refused_before_drawing(checkpoint, tmp_path, capsys, kind):
    (tmp_path / "file").write_text("mine")
    for output_dir, message in ((tmp_path / "file", "is a file; give a folder"),
                                (tmp_path / "file" / "plots", "is a file, so the folder cannot be made")):
        assert main(["plot", kind, str(checkpoint), "--output-dir", str(output_dir)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("convattn plot: error: --output-dir ") and "\n" not in err and message in err, err
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, a folder that takes no new folders")
@pytest.mark.parametrize("kind", ["kernels", "attention"])
def test_an_output_dir_that_cannot_be_made_is_one_line(checkpoint, capsys, kind):
    # /proc looks writable to root, so the folder's making failed later, as a bare errno
    assert main(["plot", kind, str(checkpoint), "--output-dir", "/proc/convattn-x/plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("convattn plot: error: --output-dir /proc/convattn-x/plots: /proc/convattn-x cannot be made (No "
                   "such file or directory); give a folder on a filesystem you can write to")
