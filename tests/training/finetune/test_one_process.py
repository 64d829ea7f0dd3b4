"""Fine-tuning runs as one process on at most one GPU, and pretraining on at most one GPU a process: a launch of
several processes (each would check, train and write the same seeds) or a process that sees several GPUs (the
Trainer would batch --batch-size on each, as DataParallel) is refused in one line, before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.finetune import SENTENCES, job_argv
from helpers.folders import one_error_line
from helpers.pretrain import tiny_args, write_corpus
from helpers.tiny import save_tiny_checkpoint

from convattn.cli import main
from convattn.training.finetune.settings import FineTuneSettings, check_trains, optimizer_steps

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), SENTENCES)


def launched(monkeypatch, processes: int, rank: int = 0) -> None:
    """The variables torchrun sets in each process it starts."""
    for name, value in (("WORLD_SIZE", processes), ("RANK", rank), ("LOCAL_RANK", rank)):
        monkeypatch.setenv(name, str(value))


def gpus(monkeypatch, count: int) -> None:
    """A process that sees `count` GPUs (CUDA_VISIBLE_DEVICES unset on a machine with that many)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("command", ["glue", "squad"])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_launch_of_several_processes_is_refused(checkpoint, tmp_path, capsys, monkeypatch, command, rank):
    launched(monkeypatch, 2, rank)
    out = tmp_path / "out"
    assert main(job_argv(command, checkpoint, out, "--max-steps", "2")) == 2
    line = one_error_line(capsys.readouterr().err, command, "fine-tuning runs in one process, and this is one of 2",
                          "(WORLD_SIZE=2)", f"run `convattn {command}` without torchrun or accelerate launch")
    assert "CUDA_VISIBLE_DEVICES=k" in line and "--output-dir" in line
    assert not out.exists()


@pytest.mark.parametrize("command", ["glue", "squad"])
def test_a_process_that_sees_several_gpus_is_refused(checkpoint, tmp_path, capsys, monkeypatch, command):
    gpus(monkeypatch, 4)
    out = tmp_path / "out"
    assert main(job_argv(command, checkpoint, out, "--max-steps", "2", "--precision", "fp32")) == 2
    line = one_error_line(capsys.readouterr().err, command, "this process sees 4 GPUs", "DataParallel",
                          "--batch-size per GPU, 4x the one asked", "give CUDA_VISIBLE_DEVICES=0")
    assert "torchrun" not in line  # fine-tuning has no multi-process form to offer
    assert not out.exists()


def test_pretraining_on_several_gpus_in_one_process_is_refused_with_torchrun_offered(tmp_path, capsys, monkeypatch):
    gpus(monkeypatch, 2)
    out = tmp_path / "run"
    assert main(tiny_args(write_corpus(tmp_path), out, "--precision", "fp32")) == 2
    one_error_line(capsys.readouterr().err, "pretrain", "this process sees 2 GPUs",
                   "one process per GPU (torchrun --nproc-per-node 2 -m convattn pretrain ...) or one GPU a process")
    assert not out.exists()


def test_one_gpu_or_a_process_per_gpu_passes_the_check(monkeypatch):
    from convattn.training.execution import check_one_gpu_per_process

    gpus(monkeypatch, 1)
    check_one_gpu_per_process("glue")
    gpus(monkeypatch, 8)
    launched(monkeypatch, 8, 3)  # torchrun: the Trainer gives each process the GPU of its LOCAL_RANK
    check_one_gpu_per_process("pretrain")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU-less machine counts none
    monkeypatch.delenv("WORLD_SIZE")
    check_one_gpu_per_process("pretrain")


def test_an_epoch_is_the_examples_over_the_batch_whatever_the_gpus(monkeypatch):
    """One process on one device takes --batch-size examples a step: an epoch's steps do not depend on the GPUs
    the machine has (those past one are refused)."""
    settings = FineTuneSettings(learning_rate=1e-4, batch_size=32, epochs=3, warmup_ratio=0.1, weight_decay=0.0,
                                layer_decay=1.0, adam_epsilon=1e-6, max_length=128, precision="fp32")
    assert optimizer_steps(settings, 1000) == 3 * 32  # ceil(1000 / 32) = 32 an epoch
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert optimizer_steps(settings, 1000) == 96
    check_trains(settings, 1000, "sst2")


@pytest.mark.slow
def test_torchrun_glue_is_refused_in_every_process_with_nothing_written(checkpoint, tmp_path):
    """Before the refusal, two torchrun processes each trained seed 0 into one folder: one failed moving its model
    over the other's, and the other wrote results of seed 1 alone."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "convattn",
               *job_argv("glue", checkpoint, out, "--max-steps", "2")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CONVATTN_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode != 0
    assert result.stderr.count("convattn glue: error: fine-tuning runs in one process, and this is one of 2") == 2
    assert "unexpected error" not in result.stderr
    assert not out.exists()
