"""Every command that trains stops on SIGTERM as on Ctrl-C (issue 51): glue and squad too, so a terminated
`--overwrite` gives the old results back at once (not only on the next run in that folder), byte for byte, and
exits as Ctrl-C does (130, one line)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.finetune import SENTENCES, job_argv
from helpers.folders import snapshot
from helpers.tiny import save_tiny_checkpoint

from convattn.cli import main
from convattn.runs.folder import REPLACED
from convattn.training.glue import job as glue_job
from convattn.training.squad import job as squad_job

JOBS = {"glue": dict(record="glue_model.json", module=glue_job), "squad": dict(record="squad_model.json",
                                                                              module=squad_job)}

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), SENTENCES)


def argv(job: str, checkpoint: Path, out: Path, *extra: str) -> list[str]:
    return job_argv(job, checkpoint, out, "--max-steps", "2", "--batch-size", "8" if job == "glue" else "4", *extra)


@pytest.fixture(scope="module")
def finished(checkpoint, tmp_path_factory) -> dict[str, Path]:
    made = {}
    for job in JOBS:
        made[job] = tmp_path_factory.mktemp("finished") / job
        assert main(argv(job, checkpoint, made[job])) == 0
    return made


@pytest.fixture
def sigterm_restored():
    """The handler a command installs is the process's: the test gives the previous one back."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def copy_of(finished: dict, job: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished[job], tmp_path / job))


@pytest.mark.usefixtures("sigterm_restored")
@pytest.mark.parametrize("job", JOBS)
def test_sigterm_during_an_overwrite_gives_the_old_results_back_at_once(checkpoint, finished, job, tmp_path, capsys,
                                                                       monkeypatch):
    run = copy_of(finished, job, tmp_path)
    before = snapshot(run)

    def terminated(*args, **kwargs):
        assert (run / REPLACED).is_dir()  # the old results aside while the new job trains
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        raise AssertionError("SIGTERM did not stop the job")

    monkeypatch.setattr(JOBS[job]["module"], "fine_tune", terminated)
    assert main(argv(job, checkpoint, run, "--overwrite", "--lr", "1e-3")) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"convattn {job}: interrupted"
    assert snapshot(run) == before


@pytest.mark.timing
def test_a_terminated_glue_overwrite_process_gives_the_old_results_back_before_it_exits(checkpoint, finished,
                                                                                        tmp_path):
    """The real thing: `convattn glue --overwrite` in its own process, sent SIGTERM while it trains."""
    run = copy_of(finished, "glue", tmp_path)
    before = snapshot(run)
    command = argv("glue", checkpoint, run, "--overwrite", "--max-steps", "100000")
    process = subprocess.Popen([sys.executable, "-m", "convattn", *command], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        give_up = time.monotonic() + 600  # only against a hang; nothing is asserted about time
        while not ((run / REPLACED).is_dir() and (run / "runs" / "sst2" / "seed0").is_dir()):
            assert process.poll() is None and time.monotonic() < give_up
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        err = process.communicate(timeout=120)[1]
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == "convattn glue: interrupted", err
    assert snapshot(run) == before  # byte-identical, modification times too: no later run needed
