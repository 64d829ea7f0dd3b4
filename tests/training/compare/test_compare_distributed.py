"""`convattn compare` under torchrun (2 CPU processes, gloo): every run trains over both processes, the main one
alone checks and writes the folder, and a comparison that asks for fine-tuning is refused before any process
joins."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers.folders import one_error_line
from helpers.pretrain import main_offline, write_corpus

from convattn.cli import main

PRESETS = "chang2021-small/absolute,chang2021-small/composite"
TINY = ["--seeds", "1", "--layers", "2", "--hidden", "32", "--heads", "4", "--intermediate", "64",
        "--embedding-size", "16", "--vocab-size", "150", "--seq-len", "32", "--batch-size", "8", "--max-steps", "4",
        "--eval-every", "2", "--save-every", "2", "--log-every", "1", "--warmup", "1", "--eval-samples", "16"]


def compare_argv(corpus, out, *extra: str) -> list[str]:
    return ["compare", "--presets", PRESETS, *TINY, "--train-file", str(corpus / "train.txt"), "--eval-file",
            str(corpus / "valid.txt"), "--output-dir", str(out), *extra]


def torchrun(argv: list[str], tmp_path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "convattn", *argv]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CONVATTN_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def first_row(run) -> dict:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.slow
def test_two_processes_train_every_run_and_the_main_one_reports(tmp_path, tmp_path_factory):
    """Before, rank 1 read the output folder while rank 0 made its probe and lock there, and refused it as a file;
    ranks that read a run's state while rank 0 wrote it could train different runs."""
    corpus = write_corpus(tmp_path, train_lines=400, eval_lines=40)
    out = tmp_path / "two"
    result = torchrun(compare_argv(corpus, out), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("report: ") == 1 and result.stderr.count("compare: 2 run(s) trained, 0 reused") == 1
    runs = sorted((out / "runs").iterdir())
    assert [run.name for run in runs] == ["chang2021-small--absolute", "chang2021-small--composite"]
    for run in runs:
        rows = [json.loads(line) for line in (run / "seed0" / "metrics.jsonl").read_text().splitlines()]
        assert [row["step"] for row in rows] == [0, 2, 4]
        assert (run / "seed0" / "checkpoints" / "checkpoint-4" / "rng_state_1.pth").exists()  # both ranks trained
    assert (out / "report.md").is_file() and (out / "compare.json").is_file()

    # a run killed between its checkpoints: the next launch resumes it over both processes from step 2 (each
    # rank's RNG state read back) and reuses the finished one
    killed = runs[1] / "seed0"
    finished = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(killed / "checkpoints" / "checkpoint-4")
    (killed / "model.safetensors").unlink()
    again = torchrun(compare_argv(corpus, out), tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("compare: 1 run(s) trained, 1 reused") == 1
    assert "composite seed 0: resuming" in again.stderr and "seed 0: training" not in again.stderr
    resumed = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in resumed] == [0, 2, 4] and resumed[:2] == finished[:2]
    assert resumed[2]["perplexity"] == pytest.approx(finished[2]["perplexity"], rel=1e-4)  # as if never killed
    assert (killed / "checkpoints" / "checkpoint-4" / "rng_state_1.pth").exists()
    assert (killed / "model.safetensors").is_file()

    # the launcher does not change a run's model: one process starts from the same untrained perplexity, given the
    # same tokenizer (the unigram trainer's pieces at tied scores follow Rust's seeded hash order: two trainings of
    # one corpus can differ)
    one = tmp_path / "one"
    argv = compare_argv(corpus, one, "--tokenizer", str(out / "tokenizer"))
    del argv[argv.index("--vocab-size"):argv.index("--vocab-size") + 2]  # the tokenizer's own
    assert main_offline(argv, tmp_path_factory) == 0
    for run in runs:
        assert first_row(one / "runs" / run.name / "seed0")["perplexity"] == pytest.approx(
            first_row(run / "seed0")["perplexity"], rel=1e-6)


@pytest.mark.parametrize("flags", [["--glue", "sst2"], ["--squad", "1.1"]])
def test_fine_tuning_under_a_launch_is_refused_before_the_processes_join(tmp_path, capsys, monkeypatch, flags):
    for name, value in (("WORLD_SIZE", "2"), ("RANK", "0"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    corpus = write_corpus(tmp_path, train_lines=40, eval_lines=10)
    out = tmp_path / "out"
    assert main(compare_argv(corpus, out, *flags)) == 2  # no process group is joined: it would wait for rank 1
    one_error_line(capsys.readouterr().err, "compare", f"{flags[0]} fine-tune in one process, and this comparison is "
                   "one of 2 that a launcher started (WORLD_SIZE=2)", f"pretrain under the launcher without {flags[0]}")
    assert not out.exists()


def test_a_comparison_on_several_gpus_in_one_process_is_refused_with_torchrun_offered(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    corpus = write_corpus(tmp_path, train_lines=40, eval_lines=10)
    out = tmp_path / "out"
    assert main(compare_argv(corpus, out, "--precision", "fp32")) == 2
    one_error_line(capsys.readouterr().err, "compare", "this process sees 2 GPUs",
                   "torchrun --nproc-per-node 2 -m convattn compare ...")
    assert not out.exists()
