"""--overwrite and reruns of glue and squad remove only what the job wrote, at any depth: the job's own names are
its tasks' (runs/<task>/, models/<task>/) and the prediction files each task writes, so a user's file or folder
of another name anywhere inside is refused by name before anything is written, and stays. The folder given as
--output-dir may be a link: the folder it reaches gets the same refusals. Staging folders a killed publish left
(models/.<task>.*.tmp) are removed by the job's next run, and nothing else of that shape."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from helpers.tiny import save_tiny_checkpoint
from helpers.trees import finished_run, tree, write_files

from convattn.cli import main
from convattn.data.glue import TASKS
from convattn.data.squad import VERSIONS
from convattn.errors import UsageError
from convattn.files import staging_dir
from convattn.runs.finetune import GLUE_PREDICTIONS, SQUAD_TASKS, check_restartable, foreign_files, layout
from convattn.runs.folder import run_folder_lock
from convattn.runs.replace import recover_replaced_run, replaces

GLUE_DATA = Path(__file__).resolve().parents[1] / "fixtures" / "glue_data"
pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_job_names_are_the_tasks_and_their_prediction_files():
    assert {name: tuple(task.test_files.values()) for name, task in TASKS.items()} == GLUE_PREDICTIONS
    assert {f"squad{version}" for version in VERSIONS} == SQUAD_TASKS


@pytest.mark.parametrize("job", ["glue", "squad"])
def test_a_finished_job_holds_only_its_own_files(tmp_path, job):
    assert foreign_files(finished_run(tmp_path / job, job), job) == []


def refused_overwrite(out: Path, job: str) -> str:
    """The line --overwrite of `job` refuses `out` with (the check it makes before anything is written)."""
    with pytest.raises(UsageError) as refused:
        replaces(out, layout(job), lambda folder: foreign_files(folder, job), overwrite=True)
    assert "\n" not in str(refused.value)
    return str(refused.value)


USERS_FILES = [  # (job, a user's file, named in the refusal as)
    ("glue", "runs/sst2/seed0/predictions/my_predictions.tsv", "runs/sst2/seed0/predictions/my_predictions.tsv"),
    ("glue", "runs/sst2/seed0/predictions/CoLA.tsv", "runs/sst2/seed0/predictions/CoLA.tsv"),  # another task's
    ("glue", "runs/myfolder/seed0/log.json", "runs/myfolder/"),  # shaped as a task's, named otherwise
    ("glue", "runs/squad1.1/seed0/run.json", "runs/squad1.1/"),  # another job's task
    ("glue", "submission/mine.tsv", "submission/mine.tsv"),
    ("glue", "models/mine/config.json", "models/mine/"),
    ("glue", "models/.sst2.abcd1234.tmp/notes.txt", "models/.sst2.abcd1234.tmp/notes.txt"),
    ("glue", "models/.mine.abcd1234.tmp/config.json", "models/.mine.abcd1234.tmp/"),
    ("squad", "runs/squad1.1/seed0/predictions/SST-2.tsv", "runs/squad1.1/seed0/predictions/SST-2.tsv"),
    ("squad", "runs/myfolder/notes.txt", "runs/myfolder/"),
    ("squad", "runs/sst2/seed0/run.json", "runs/sst2/"),
    ("squad", "models/sst2/config.json", "models/sst2/"),
]


@pytest.mark.parametrize(("job", "mine", "named"), USERS_FILES, ids=[mine for _, mine, _ in USERS_FILES])
def test_overwrite_refuses_a_users_file_at_any_depth(tmp_path, job, mine, named):
    out = finished_run(tmp_path / "run", job)
    write_files(out, {mine: "mine"})
    before = tree(tmp_path)
    message = refused_overwrite(out, job)
    assert "holds files convattn did not write" in message and named in message, message
    assert tree(tmp_path) == before


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), ["a dog runs in the park .", "the cat sat ."] * 30)


@pytest.mark.parametrize(("mine", "named"), [
    ("runs/sst2/seed0/predictions/my_predictions.tsv", "runs/sst2/seed0/predictions/my_predictions.tsv"),
    ("runs/myfolder/seed0/log.json", "runs/myfolder/"),
])
def test_glue_overwrite_keeps_the_users_file(checkpoint, tmp_path, capsys, monkeypatch, mine, named):
    """The issue's two cases, from the command line: refused in one line, exit 2, and the file is still there."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = finished_run(tmp_path / "run", "glue")
    write_files(out, {mine: "mine"})
    before = tree(tmp_path)
    assert main(["glue", "--model", str(checkpoint), "--task", "sst2", "--data-dir", str(GLUE_DATA), "--output-dir",
                 str(out), "--seeds", "1", "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("convattn glue: error: --overwrite") and "\n" not in err and named in err
    assert tree(tmp_path) == before and (out / mine).read_text() == "mine"


def test_an_output_folder_reached_through_a_link_gets_the_same_refusals(tmp_path):
    real = finished_run(tmp_path / "elsewhere" / "run", "glue")
    write_files(real, {"runs/sst2/seed0/notes.txt": "mine", "models/sst2/eval.ipynb": "{}"})
    out = tmp_path / "out"
    out.symlink_to(real)
    before = tree(tmp_path)
    assert "runs/sst2/seed0/notes.txt" in refused_overwrite(out, "glue")
    assert tree(tmp_path) == before
    (real / "runs/sst2/seed0/run.json").unlink()  # an interrupted seed, which a rerun removes to start again
    before = tree(tmp_path)
    with pytest.raises(UsageError, match=re.escape("runs/sst2/seed0/notes.txt")):
        check_restartable(out, "glue", [out / "runs/sst2/seed0"])
    with pytest.raises(UsageError, match=re.escape("models/sst2/eval.ipynb")):  # a better seed replaces models/
        check_restartable(out, "glue", [])
    with run_folder_lock(out):
        recover_replaced_run(out, layout("glue"))  # the link given is followed: no link inside, nothing to do
    assert tree(tmp_path) == before


def published_staging(out: Path, task: str) -> Path:
    """A staging folder of models/<task>/ as a publish killed before its rename leaves it."""
    staging = staging_dir(out / "models" / task)
    shutil.copytree(out / "models" / task, staging, dirs_exist_ok=True)
    (staging / ".fine_tuned.json.k3j4h5g6.tmp").write_text("{")  # the record, half written
    return staging


@pytest.mark.parametrize(("job", "task"), [("glue", "sst2"), ("squad", "squad1.1")])
def test_the_next_run_removes_what_a_killed_publish_left_and_nothing_else(tmp_path, job, task):
    out = finished_run(tmp_path / "run", job)
    leftover = published_staging(out, task)
    kept = write_files(out / "models", {".mine.abcd1234.tmp/config.json": "{}",  # not a task of the job
                                        f".{task}.abcd1234.tmp/notes.txt": "mine",  # holds a user's file
                                        f".{task}.zyxw9876.tmp": "a file, not a staging folder",
                                        # names tempfile never gives (capitals; a suffix after .tmp)
                                        f".{task}.Backup01.tmp/config.json": "{}",
                                        f".{task}.abcd1234.tmp.old/config.json": "{}"})
    assert sorted(foreign_files(out, job)) == sorted([
        "models/.mine.abcd1234.tmp/", f"models/.{task}.abcd1234.tmp/notes.txt", f"models/.{task}.Backup01.tmp/",
        f"models/.{task}.abcd1234.tmp.old/"])
    before = {name: value for name, value in tree(tmp_path).items() if leftover.name not in name}
    with run_folder_lock(out):
        recover_replaced_run(out, layout(job))
    assert not leftover.exists() and tree(tmp_path) == before and (kept / f".{task}.abcd1234.tmp/notes.txt").is_file()
