"""A pretraining run that cannot be what it claims is refused in one line, exit 2, before anything is written: a
RANK left in the environment of a lone process (it would write without the folder's lock), a model too large to
build, a schedule whose every step runs at learning rate 0. A run that still trained nothing is no result."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from helpers.folders import one_error_line
from helpers.pretrain import tiny_args, write_corpus

from convattn.cli import main


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


SHORT = ["--eval-every", "1", "--save-every", "1"]
REFUSED = [
    ({"RANK": "1"}, [], "RANK=1 is set, but this process runs alone (WORLD_SIZE is unset)"),
    ({"RANK": "3", "WORLD_SIZE": "1"}, [], "RANK=3 is set, but this process runs alone (WORLD_SIZE is 1)"),
    ({"WORLD_SIZE": "0"}, [], "WORLD_SIZE='0' is not a number of processes (a whole number, at least 1)"),
    ({"WORLD_SIZE": "two"}, [], "WORLD_SIZE='two' is not a number of processes"),
    ({"RANK": "first"}, [], "RANK='first' is not a process number (a whole number, at least 0)"),
    ({"LOCAL_RANK": "1"}, [], "LOCAL_RANK=1 is set, but this process runs alone (WORLD_SIZE is unset)"),
    ({"RANK": "4", "WORLD_SIZE": "2"}, [], "RANK=4 is not below WORLD_SIZE=2"),
    ({}, ["--set", "relative_reach=1000000000"], "parameters (100% of them from relative_reach 1000000000)"),
    ({}, ["--set", "relative_reach=100000000"], "at least 4,800,496,504 parameters (100% of them from relative_reach"),
    ({}, ["--set", "value_depthwise_conv=true", "--set", "relative_reach=50000000"],
     "of them from relative_reach 50000000"),
    ({}, ["--preset", "chang2021-small/absolute", "--max-len", "10000000000"], "of them from --max-len 10000000000"),
    ({}, ["--set", "type_vocab_size=10000000000"], "of them from type_vocab_size 10000000000"),
    ({}, ["--max-steps", "1", "--warmup", "1", *SHORT], "--warmup 1 is not below --max-steps 1"),
    ({}, ["--max-steps", "1", "--time-budget", "1m", "--warmup", "0.1", *SHORT],
     "--max-steps 1 with --time-budget: the only step runs where the warmup starts, at learning rate 0"),
]


@pytest.mark.parametrize(("env", "extra", "said"), REFUSED)
def test_a_run_that_cannot_be_what_it_claims_is_refused_before_anything_is_written(corpus, tmp_path, monkeypatch,
                                                                                   capsys, env, extra, said):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "out"
    assert main(tiny_args(corpus, out, *extra)) == 2
    one_error_line(capsys.readouterr().err, "pretrain", said)
    assert not out.exists()


def files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_one_step_trains_and_a_run_that_took_no_step_above_learning_rate_0_is_no_result(corpus, tmp_path,
                                                                                       monkeypatch, capsys):
    """A warmup fraction of one step rounds to no warmup (the Trainer rounded it up: its only step ran at lr 0). The
    guard behind the checks: a run whose every step ran at lr 0 (here forced) leaves no model and no run, and an
    --overwrite that trained nothing gives the old run back."""
    from convattn.training.pretrain.callbacks import steps_trained
    from convattn.training.pretrain.trainer import PretrainTrainer

    def at_zero(self, num_training_steps, optimizer=None):
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, lambda step: 0.0)
        return self.lr_scheduler

    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(PretrainTrainer, "create_scheduler", at_zero)
        assert main(tiny_args(corpus, out, "--max-steps", "1", "--warmup", "0.06", *SHORT)) == 2
    one_error_line(capsys.readouterr().err, "pretrain", "pretraining took 1 step(s), none at a learning rate above 0",
                   "no model is saved; give a longer --max-steps or a shorter --warmup")
    assert not out.exists()

    assert main(tiny_args(corpus, out, "--max-steps", "1", "--warmup", "0.06", *SHORT)) == 0
    assert steps_trained(out / "checkpoints" / "checkpoint-1") == 1
    before = files(out)
    with monkeypatch.context() as patch:
        patch.setattr(PretrainTrainer, "create_scheduler", at_zero)
        assert main(tiny_args(corpus, out, "--overwrite", "--max-steps", "1", "--warmup", "0.06", "--seed", "7",
                              *SHORT)) == 2
    one_error_line(capsys.readouterr().err, "pretrain", "none at a learning rate above 0")
    assert files(out) == before


@pytest.mark.parametrize("evaluated", ["the file", "a link", "its folder"])
def test_eval_text_that_is_training_text_is_refused_naming_both(corpus, tmp_path, capsys, evaluated):
    link = tmp_path / "valid-link.txt"
    link.symlink_to(corpus / "train.txt")
    given = {"the file": corpus / "train.txt", "a link": link, "its folder": corpus}[evaluated]
    args = tiny_args(corpus, tmp_path / "out")
    args[args.index(str(corpus / "valid.txt"))] = str(given)
    assert main(args) == 2
    one_error_line(capsys.readouterr().err, "pretrain", f"--eval-file {given}", f"--train-file {corpus / 'train.txt'}",
                   "eval text is training text", "--allow-eval-overlap")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra", [[], ["--resume"], ["--overwrite"]])
def test_a_folder_holding_only_a_users_notes_is_refused_naming_them(corpus, tmp_path, capsys, extra):
    """Not the generic "not empty ... continue with --resume" (there is no run to continue): the user's file is
    named, and nothing is written (issue 66)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.md").write_text("my notes\n")
    assert main(tiny_args(corpus, out, *extra)) == 2
    line = one_error_line(capsys.readouterr().err, "pretrain", str(out), "notes.md")
    assert "continue that run" not in line
    assert sorted(p.name for p in out.iterdir()) == ["notes.md"]
