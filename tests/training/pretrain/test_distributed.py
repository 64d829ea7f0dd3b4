"""Data-parallel pretraining: `torchrun --nproc-per-node 2` on CPU (gloo), tiny config, in a subprocess."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch
from accelerate import PartialState

WORDS = "the of and to in a is was for on as with by he at from his an were are which this be or its".split()  # noqa: SIM905


@pytest.mark.slow
def test_two_cpu_processes_train_one_model(tmp_path):
    rng = random.Random(0)
    corpus = tmp_path / "train.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14)))
                                for _ in range(600)) + "\n")
    out = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "convattn", "pretrain",
               "--preset", "chang2021-small/composite", "--layers", "2", "--hidden", "32", "--heads", "4",
               "--intermediate", "64", "--embedding-size", "16", "--vocab-size", "150", "--seq-len", "32",
               "--batch-size", "8", "--max-steps", "6", "--eval-every", "3", "--save-every", "3", "--warmup", "1",
               "--train-file", str(corpus), "--output-dir", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CONVATTN_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("pretraining done") == 1  # the summary comes from rank 0 only
    assert "then linear decay; 2 processes" in result.stderr and "warning" not in result.stderr
    checkpoint = out / "checkpoints" / "checkpoint-6"
    assert (checkpoint / "rng_state_0.pth").exists() and (checkpoint / "rng_state_1.pth").exists()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 3, 6]
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["num_input_tokens_seen"] == rows[-1]["tokens_seen"] > 0
    from transformers import AutoModelForMaskedLM

    import convattn  # noqa: F401

    model = AutoModelForMaskedLM.from_pretrained(out)
    assert torch.isfinite(next(model.parameters())).all()

    # the launcher does not change a metric: one process evaluates the untrained model to the same perplexity
    single = [sys.executable, "-m", "convattn", *command[command.index("pretrain"):-1], str(tmp_path / "one"),
              "--max-steps", "2", "--eval-every", "2", "--save-every", "2"]
    result = subprocess.run(single, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    first = json.loads((tmp_path / "one" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0 and first["perplexity"] == pytest.approx(rows[0]["perplexity"], rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(("environment", "warned"), [
    ({}, None),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "MASTER_ADDR is set, as launchers of several processes "
                                                           "do, but this process runs alone"),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_SIZE=2 says 2 processes were started, but 1 joined"),
])
def test_the_start_line_says_how_many_processes_run(tmp_path, capsys, monkeypatch, environment, warned):
    """`accelerate launch --cpu --num_processes 2`, or a MULTI_CPU config, runs one process (with MASTER_ADDR set):
    said, not silent, with the flags that start several."""
    from helpers.pretrain import tiny_args, write_corpus

    from convattn.cli import main

    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(tiny_args(write_corpus(tmp_path), tmp_path / "run", "--max-steps", "4")) == 0
    err = capsys.readouterr().err
    assert "then linear decay; 1 process\n" in err
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert warnings == ([] if warned is None else [warnings[0]])
    assert warned is None or (warnings[0].startswith("convattn pretrain: warning: ") and warned in warnings[0])
    assert "--multi_cpu" not in err  # accelerate has no such flag


class Stop(Exception):
    """Raised where the test has seen enough of a run."""


@pytest.mark.parametrize("rank", [0, 1])
def test_the_main_process_checks_the_output_folder_before_the_others_read_it(tmp_path, monkeypatch, rank):
    """Rank 1 read the folder while rank 0 made and removed its probe folder there, and failed ("No such file or
    directory", 1 CI run in 7): now the other ranks wait at a barrier that rank 0 reaches once it has checked the
    folder, taken its lock and mended what a killed run left."""
    from convattn.training.pretrain import job
    from convattn.training.pretrain.resolve import resolve_options

    seen = []

    def step(name, call):
        def recorded(*args, **kwargs):
            seen.append(name)
            return call(*args, **kwargs)
        return recorded

    monkeypatch.setattr(job, "main_process", lambda: rank == 0)
    monkeypatch.setattr(PartialState, "is_main_process", property(lambda state: rank == 0))
    monkeypatch.setattr(PartialState, "wait_for_everyone", step("barrier", lambda state: None))
    for name in ("check_output_folder", "run_folder_lock", "recover_replaced_run", "check_output_dir"):
        monkeypatch.setattr(job, name, step(name, getattr(job, name)))
    monkeypatch.setattr(job, "train_run", step("train_run", lambda *args: (_ for _ in ()).throw(Stop)))
    options = resolve_options(output_dir=tmp_path / "run", preset="chang2021-small/composite",
                              training={"max_steps": 10})
    with pytest.raises(Stop):
        job.pretrain(options)
    checks = ["check_output_folder", "run_folder_lock", *(["recover_replaced_run"] if rank == 0 else []),
              "check_output_dir"]
    assert seen == ([*checks, "barrier", "train_run"] if rank == 0 else ["barrier", *checks, "train_run"])


def test_a_main_process_that_refuses_the_folder_lets_no_other_process_read_it(tmp_path, monkeypatch):
    """The others stay at the barrier until the launcher ends them, rather than reading a folder rank 0 may be
    removing."""
    from convattn.errors import UsageError
    from convattn.training.pretrain import job
    from convattn.training.pretrain.resolve import resolve_options

    barriers = []
    monkeypatch.setattr(PartialState, "wait_for_everyone", lambda state: barriers.append(state))
    (tmp_path / "run").write_text("a user's file")
    options = resolve_options(output_dir=tmp_path / "run", preset="chang2021-small/composite",
                              training={"max_steps": 10})
    with pytest.raises(UsageError, match="is a file"):
        job.pretrain(options)
    assert barriers == []
