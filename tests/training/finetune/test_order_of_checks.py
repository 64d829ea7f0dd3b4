"""The order in which `convattn glue` and `convattn squad` check a job before they write anything
(docs/reliability.md: inputs are checked before anything is written; a refused command leaves nothing behind).
A job facing every fault at once is refused for the first of them, in this order, and writes nothing:

    the task's inputs (a data file missing)      the output folder (a file)      the model (pickles only)
    the folder's lock (busy)      a link where the job writes      a finished seed made with other settings
    a finished seed past --seeds      a user's file in a seed the job would start again      the data's content
    a run that trains nothing
    another model's finished runs (checked at the job's first write, its model record)

Each step removes the fault just refused and runs the same command again, so the next one is said; with none
left the job trains the two seeds, the interrupted ones started again."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.damage import pickle_only
from helpers.finetune import GLUE_DATA, SENTENCES, SQUAD, job_argv
from helpers.folders import one_error_line, snapshot
from helpers.tiny import save_tiny_checkpoint

from convattn.cli import main
from convattn.files import model_identity
from convattn.runs.folder import run_folder_lock

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), SENTENCES)


class Job:
    """One job's command and the faults in its way, each removed in turn (`state` says which remain)."""

    def __init__(self, job: str, checkpoint: Path, tmp_path: Path):
        self.job, self.checkpoint, self.tmp = job, checkpoint, tmp_path
        self.out = tmp_path / "out"
        self.runs = "sst2" if job == "glue" else "squad1.1"  # runs/<name>/ of the job's seeds
        self.other = "cola" if job == "glue" else "squad2.0"  # a task of the folder this job does not run
        self.bad_model = Path(shutil.copytree(checkpoint, tmp_path / "pickled"))
        pickle_only(self.bad_model)
        self.busy = False
        if job == "glue":
            self.data = Path(shutil.copytree(GLUE_DATA, tmp_path / "glue_data"))
            (self.data / "SST-2" / "dev.tsv").rename(tmp_path / "dev.tsv")  # missing: a task's input
            (self.data / "SST-2" / "train.tsv").write_text("sentence\tlabel\nhello world\tabc\n")  # bad content
        else:
            self.train = tmp_path / "missing.json"
            self.empty_question = tmp_path / "train-v1.1.json"
            data = json.loads((SQUAD / "train-v1.1.json").read_text())
            data["data"][0]["paragraphs"][0]["qas"][0]["question"] = ""
            self.empty_question.write_text(json.dumps(data))
        self.model, self.max_steps = self.bad_model, "1"
        self.out.write_text("mine")  # the output folder is a file

    def argv(self) -> list[str]:
        extra = ["--seeds", "2", "--max-steps", self.max_steps, "--batch-size", "8" if self.job == "glue" else "4"]
        if self.job == "glue":
            return job_argv("glue", self.model, self.out, *extra, "--data-dir", str(self.data))
        return job_argv("squad", self.model, self.out, *extra, train=self.train)

    def refused(self, capsys, *needles: str) -> None:
        """The command exits 2 with one line naming `needles`, and the output folder (or file) is as it was."""
        def run() -> None:
            before = snapshot(self.out) if self.out.is_dir() else self.out.read_bytes()
            assert main(self.argv()) == 2
            one_error_line(capsys.readouterr().err, self.job, *needles)
            assert (snapshot(self.out) if self.out.is_dir() else self.out.read_bytes()) == before

        if self.busy:
            with run_folder_lock(self.out):  # another run holds it
                run()
        else:
            run()

    def faulty_folder(self) -> None:
        """The output folder as a job left it, with every fault of a folder: another model's record and finished
        run, seed 0 finished with other settings, a user's notes in seed 1 (unfinished), seed 2 finished (past
        --seeds 2), log.txt a link."""
        self.out.unlink()
        seeds = self.out / "runs" / self.runs
        (seeds / "seed0").mkdir(parents=True)
        (seeds / "seed0" / "run.json").write_text(json.dumps({"settings": {"learning_rate": 1.0}}))
        (seeds / "seed1").mkdir()
        (seeds / "seed1" / "MY_NOTES.txt").write_text("mine")
        (seeds / "seed2").mkdir()
        (seeds / "seed2" / "run.json").write_text(json.dumps({"settings": {"learning_rate": 1.0}}))
        (self.out / "runs" / self.other / "seed0").mkdir(parents=True)
        (self.out / "runs" / self.other / "seed0" / "run.json").write_text("{}")
        (self.out / f"{self.job}_model.json").write_text(json.dumps({"model": "other",
                                                                      "identity": "0123456789abcdef"}))
        (self.tmp / "elsewhere.txt").write_text("")
        (self.out / "log.txt").symlink_to(self.tmp / "elsewhere.txt")


def restore_dev(job: Job) -> None:
    if job.job == "glue":
        (job.tmp / "dev.tsv").rename(job.data / "SST-2" / "dev.tsv")
    else:
        job.train = job.empty_question


def good_data(job: Job) -> None:
    if job.job == "glue":
        shutil.copy(GLUE_DATA / "SST-2" / "train.tsv", job.data / "SST-2" / "train.tsv")
    else:
        job.train = SQUAD / "train-v1.1.json"


def this_models_record(job: Job) -> None:
    """The record of the model fine-tuned, the other model's finished run gone."""
    shutil.rmtree(job.out / "runs" / job.other)
    (job.out / f"{job.job}_model.json").write_text(json.dumps({"model": str(job.checkpoint),
                                                                "identity": model_identity(str(job.checkpoint))}))


def without(path: Callable[[Job], Path]) -> Callable[[Job], None]:
    return lambda job: path(job).unlink()


def then_busy(job: Job) -> None:
    job.faulty_folder()
    job.busy = True


# (what is refused, per job: what the line says; how the fault is then removed)
LADDER = [
    ("a task's input", {"glue": ["no sst2 dev data"], "squad": ["missing.json: no such file"]}, restore_dev),
    ("the output folder", {"glue": ["--output-dir", "is a file"], "squad": ["--output-dir", "is a file"]}, then_busy),
    ("the model", {"glue": ["pytorch_model.bin"], "squad": ["pytorch_model.bin"]},
     lambda job: setattr(job, "model", job.checkpoint)),
    ("the lock", {"glue": ["is in use by another convattn run"], "squad": ["is in use by another convattn run"]},
     lambda job: setattr(job, "busy", False)),
    ("a link", {"glue": ["log.txt is a symbolic link"], "squad": ["log.txt is a symbolic link"]},
     without(lambda job: job.out / "log.txt")),
    ("other settings", {"glue": ["runs/sst2/seed0 was made with other settings"],
                        "squad": ["runs/squad1.1/seed0 was made with other settings"]},
     without(lambda job: job.out / "runs" / job.runs / "seed0" / "run.json")),
    ("a seed past --seeds", {"glue": ["--seeds 2: ", "also holds finished seed(s) 2"],
                             "squad": ["--seeds 2: ", "also holds finished seed(s) 2"]},
     lambda job: shutil.rmtree(job.out / "runs" / job.runs / "seed2")),
    ("a user's file", {"glue": ["runs/sst2/seed1/MY_NOTES.txt", "did not write"],
                       "squad": ["runs/squad1.1/seed1/MY_NOTES.txt", "did not write"]},
     without(lambda job: job.out / "runs" / job.runs / "seed1" / "MY_NOTES.txt")),
    ("the data", {"glue": ["train.tsv:2: unknown sst2 label 'abc'"], "squad": ["the question is empty"]},
     good_data),
    ("training nothing", {"glue": ["--max-steps 1 trains nothing"], "squad": ["--max-steps 1 trains nothing"]},
     lambda job: setattr(job, "max_steps", "2")),
    ("another model", {"glue": ["holds 1 finished run(s) of another model"],
                       "squad": ["holds 1 finished run(s) of another model"]}, this_models_record),
]


@pytest.mark.parametrize("job", ["glue", "squad"])
def test_each_check_comes_before_the_next_and_a_refusal_writes_nothing(checkpoint, tmp_path, capsys, job):
    state = Job(job, checkpoint, tmp_path)
    for _, needles, remove in LADDER:
        state.refused(capsys, *needles[job])
        remove(state)
    assert main(state.argv()) == 0  # no fault left: both seeds (each left unfinished) trained from the start
    seeds = state.out / "runs" / state.runs
    assert sorted(p.name for p in seeds.iterdir()) == ["seed0", "seed1"]
    assert all(json.loads((seeds / seed / "run.json").read_text())["train"]["steps"] == 2 for seed in ("seed0",
                                                                                                          "seed1"))
    assert not (seeds / "seed1" / "MY_NOTES.txt").exists()
