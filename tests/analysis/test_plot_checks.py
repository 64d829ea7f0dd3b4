"""`convattn plot kernels|attention` checks the checkpoint folder before drawing: one line, exit 2, no figure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.tiny import tiny_config
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertForMaskedLM

from convattn import ConvAttnForMaskedLM
from convattn.cli import main


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plot") / "model"
    torch.manual_seed(0)
    ConvAttnForMaskedLM(tiny_config("chang2021-small/composite+depthwise")).save_pretrained(path)
    return path


@pytest.fixture
def checkpoint(saved, tmp_path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "model"))


def nan_weights(folder: Path) -> None:
    weights = load_file(folder / "model.safetensors")
    for tensor in weights.values():
        tensor.fill_(float("nan"))
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def config_with(folder: Path, **fields) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


def pickle_only(folder: Path) -> None:
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def bert(folder: Path) -> None:
    shutil.rmtree(folder)
    BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32)).save_pretrained(folder)


@pytest.mark.parametrize("kind", ["kernels", "attention"])
@pytest.mark.parametrize(("damage", "message"), [
    (nan_weights, "non-finite (NaN or infinite) weights"),
    (lambda f: config_with(f, extra_field=[1]), "fields convattn does not know: extra_field"),
    (lambda f: config_with(f, relative_reach=float("inf")), "relative_reach must be a finite number"),
    (lambda f: (f / "config.json").write_text("{"), "is not JSON"),
    (pickle_only, "safetensors only"),
    (lambda f: config_with(f, num_hidden_layers=1), "fit no part of this model"),
    (bert, "is a transformers bert model, not a convattn model; these plots read convattn's mechanisms"),
])
def test_bad_checkpoints_are_one_line_and_no_figure(checkpoint, capsys, kind, damage, message):
    damage(checkpoint)
    assert main(["plot", kind, str(checkpoint)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("convattn plot: error: ") and "\n" not in err and message in err
    assert not (checkpoint / "plots").exists()


def test_a_checkpoint_that_is_not_a_folder_is_refused(checkpoint, capsys):
    assert main(["plot", "kernels", str(checkpoint / "config.json")]) == 2
    assert "is not a saved model directory" in capsys.readouterr().err
