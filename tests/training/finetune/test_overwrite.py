"""`convattn glue --overwrite` and `convattn squad --overwrite`, with pretrain's semantics (the same code,
`convattn.runs.replace`): the old job's results stay byte-identical until the new job has finished its first seed;
a replacement that fails, is stopped or is killed gives them back; only files the job wrote are replaced (a user's
file anywhere inside the folder is refused by name); without --overwrite the refusals of today hold."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.tiny import save_tiny_checkpoint

from convattn.cli import main
from convattn.data.squad import load_squad_file
from convattn.errors import UsageError
from convattn.runs.finetune import foreign_files
from convattn.runs.folder import REPLACED, run_folder_lock
from convattn.runs.replace import recover_replaced_run
from convattn.training.glue import job as glue_job
from convattn.training.squad import job as squad_job

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GLUE_DATA = FIXTURES / "glue_data"
SQUAD = FIXTURES / "squad"

pytestmark = pytest.mark.usefixtures("one_thread")


def sentences() -> list[str]:
    questions = load_squad_file(SQUAD / "train-v1.1.json", "1.1")
    return list(questions["context"]) * 3 + list(questions["question"]) * 3 + \
        ["a dog runs in the park .", "the cat sat on the mat .", "nothing moves at all ."] * 50


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), sentences())


# per job: the record it writes first, the folder of its seeds, its job module
JOBS = {
    "glue": dict(record="glue_model.json", seeds="runs/sst2", module=glue_job),
    "squad": dict(record="squad_model.json", seeds="runs/squad1.1", module=squad_job),
}


def argv(job: str, checkpoint: Path, out: Path, *extra: str) -> list[str]:
    if job == "glue":
        return ["glue", "--model", str(checkpoint), "--task", "sst2", "--data-dir", str(GLUE_DATA), "--output-dir",
                str(out), "--seeds", "1", "--max-steps", "3", "--batch-size", "8", *extra]
    return ["squad", "--model", str(checkpoint), "--version", "1.1", "--train-file", str(SQUAD / "train-v1.1.json"),
            "--dev-file", str(SQUAD / "dev-v1.1.json"), "--output-dir", str(out), "--seeds", "1", "--max-steps", "3",
            "--batch-size", "4", "--max-length", "48", "--doc-stride", "16", "--max-query-length", "12", *extra]


@pytest.fixture(scope="module")
def finished(checkpoint, tmp_path_factory):
    """A finished job of each kind (one seed), made once; tests work on copies."""
    made = {}
    for job in JOBS:
        out = tmp_path_factory.mktemp("finished") / job
        assert main(argv(job, checkpoint, out)) == 0
        made[job] = out
    return made


def copy_of(finished: dict, job: str, tmp_path: Path) -> Path:
    run = tmp_path / job
    shutil.copytree(finished[job], run)
    return run


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under `folder`: its content hash and modification time."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys, job: str, *needles: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"convattn {job}: error:") and err.count("error") == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def settings_of(run: Path, job: str) -> dict:
    return json.loads((run / JOBS[job]["seeds"] / "seed0" / "run.json").read_text())["settings"]


@pytest.mark.parametrize("job", JOBS)
def test_the_finished_job_holds_only_what_it_wrote(finished, job):
    assert foreign_files(finished[job], job) == []


@pytest.mark.parametrize("job", JOBS)
def test_overwrite_replaces_the_job_and_without_it_the_refusal_holds(finished, job, tmp_path, capsys):
    run = copy_of(finished, job, tmp_path)
    before = snapshot(run)
    assert main(argv(job, checkpoint_of(run, job), run, "--lr", "1e-3")) == 2  # no --overwrite: today's refusal
    one_error_line(capsys, job, "other settings")
    assert snapshot(run) == before
    assert main(argv(job, checkpoint_of(run, job), run, "--lr", "1e-3", "--overwrite")) == 0
    assert "replacing the run in" in capsys.readouterr().err
    assert settings_of(run, job)["learning_rate"] == 1e-3
    assert not any(p.name.startswith(REPLACED) for p in run.iterdir())  # the old job went once the new one stood
    assert foreign_files(run, job) == []


def checkpoint_of(run: Path, job: str) -> Path:
    return Path(json.loads((run / JOBS[job]["record"]).read_text())["model"])


@pytest.mark.parametrize("job", JOBS)
def test_overwrite_replaces_another_models_results(finished, job, tmp_path, capsys):
    run = copy_of(finished, job, tmp_path)
    other = save_tiny_checkpoint(tmp_path / "other", ["some other words entirely"] * 20 + sentences())
    before = snapshot(run)
    assert main(argv(job, other, run)) == 2
    one_error_line(capsys, job, "another model")
    assert snapshot(run) == before
    assert main(argv(job, other, run, "--overwrite")) == 0
    assert json.loads((run / JOBS[job]["record"]).read_text())["model"] == str(other)


USERS_FILES = [  # (where, relative to the folder, per job) -> named in the refusal
    ("top", {"glue": "my_notes.md", "squad": "my_notes.md"}),
    ("in a seed", {"glue": "runs/sst2/seed0/MY_NOTES.txt", "squad": "runs/squad1.1/seed0/MY_NOTES.txt"}),
    ("in a task's runs", {"glue": "runs/sst2/notes.txt", "squad": "runs/squad1.1/notes.txt"}),
    ("in a published model", {"glue": "models/sst2/eval.ipynb", "squad": "models/squad1.1/eval.ipynb"}),
    ("a folder of the user's", {"glue": "runs/sst2/seed0/plots/a.png", "squad": "runs/squad1.1/seed0/plots/a.png"}),
    ("the submission", {"glue": "submission/my_copy.txt", "squad": "submission/SST-2.tsv"}),
]


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize(("where", "files"), USERS_FILES, ids=[where for where, _ in USERS_FILES])
def test_overwrite_refuses_the_users_files_anywhere_inside(finished, job, tmp_path, capsys, where, files):
    run = copy_of(finished, job, tmp_path)
    mine = run / files[job]
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.write_text("mine")
    before = snapshot(run)
    assert main(argv(job, checkpoint_of(run, job), run, "--overwrite")) == 2
    named = files[job] if where != "a folder of the user's" else str(Path(files[job]).parent) + "/"
    if where == "the submission" and job == "squad":
        named = "submission/"  # not a folder a SQuAD job writes
    one_error_line(capsys, job, named, "did not write")
    assert snapshot(run) == before


@pytest.mark.parametrize("job", JOBS)
def test_overwrite_refuses_a_folder_that_is_not_this_jobs(finished, job, tmp_path, capsys):
    other = "squad" if job == "glue" else "glue"
    run = copy_of(finished, other, tmp_path)
    before = snapshot(run)
    assert main(argv(job, checkpoint_of(run, other), run, "--overwrite")) == 2
    one_error_line(capsys, job, f"no {JOBS[job]['record']}")
    assert snapshot(run) == before
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    (mine / JOBS[job]["record"]).write_text("{}")
    assert main(argv(job, checkpoint_of(run, other), mine, "--overwrite")) == 2
    one_error_line(capsys, job, "thesis.tex")
    assert (mine / "thesis.tex").read_text() == "years of work"


@pytest.mark.parametrize("job", JOBS)
def test_overwrite_of_an_empty_or_missing_folder_just_runs(finished, job, tmp_path):
    checkpoint = checkpoint_of(finished[job], job)
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "missing"):
        assert main(argv(job, checkpoint, out, "--overwrite")) == 0
        assert (out / JOBS[job]["seeds"] / "seed0" / "run.json").is_file()


FAILURES = [
    pytest.param(UsageError("--model changed while this job ran"), 2, id="refused"),
    pytest.param(KeyboardInterrupt(), 130, id="ctrl-c"),
    pytest.param(MemoryError(), 1, id="crash"),
]


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize(("failure", "code"), FAILURES)
def test_a_replacement_that_fails_before_its_first_seed_gives_the_old_job_back(finished, job, tmp_path,
                                                                                 monkeypatch, failure, code):
    run = copy_of(finished, job, tmp_path)
    before = snapshot(run)

    def fails(*args, **kwargs):
        assert (run / REPLACED).is_dir()  # the old job aside while the new one trains
        raise failure

    monkeypatch.setattr(JOBS[job]["module"], "fine_tune", fails)
    assert main(argv(job, checkpoint_of(run, job), run, "--overwrite", "--lr", "1e-3")) == code
    assert snapshot(run) == before


@pytest.mark.parametrize("job", JOBS)
def test_a_replacement_failing_after_its_first_seed_keeps_the_new_seed(finished, job, tmp_path, monkeypatch):
    run = copy_of(finished, job, tmp_path)
    module = JOBS[job]["module"]
    fine_tune, calls = module.fine_tune, []

    def second_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            assert not (run / REPLACED).exists()  # the first seed stood: the old job is gone
            raise UsageError("stopped")
        return fine_tune(*args, **kwargs)

    monkeypatch.setattr(module, "fine_tune", second_fails)
    assert main(argv(job, checkpoint_of(run, job), run, "--overwrite", "--lr", "1e-3", "--seeds", "2")) == 2
    assert settings_of(run, job)["learning_rate"] == 1e-3
    assert not (run / JOBS[job]["seeds"] / "seed1" / "run.json").exists()
    monkeypatch.setattr(module, "fine_tune", fine_tune)  # the same command without --overwrite finishes it
    assert main(argv(job, checkpoint_of(run, job), run, "--lr", "1e-3", "--seeds", "2")) == 0


@pytest.mark.timing
@pytest.mark.parametrize("job", JOBS)
@pytest.mark.slow
def test_a_replacement_killed_before_its_first_seed_leaves_the_old_job_recoverable(finished, job, tmp_path, capsys):
    run = copy_of(finished, job, tmp_path)
    before = snapshot(run)
    command = argv(job, checkpoint_of(run, job), run, "--overwrite", "--max-steps", "100000")
    process = subprocess.Popen([sys.executable, "-m", "convattn", *command], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        give_up = time.monotonic() + 600  # only against a hang; nothing is asserted about time
        while not ((run / REPLACED).is_dir() and (run / JOBS[job]["record"]).is_file()):
            assert process.poll() is None and time.monotonic() < give_up
            time.sleep(0.05)
    finally:
        process.kill()  # kill -9: no clean-up runs
        process.wait()
    assert (run / REPLACED).is_dir()  # the old job, aside, beside the new job's first files
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    with run_folder_lock(copy):
        recover_replaced_run(copy, JOBS[job]["module"].GLUE if job == "glue" else JOBS[job]["module"].SQUAD)
    assert snapshot(copy) == before  # byte-identical, modification times too
    # the user's way back: the same command as before, without --overwrite, finds its finished seed again
    capsys.readouterr()
    assert main(argv(job, checkpoint_of(run, job), run)) == 0
    err = capsys.readouterr().err
    assert "the earlier run is back as it was" in err and "already finished" in err
    after = snapshot(run)
    assert {name: after[name] for name in before if "seed0" in name} == \
        {name: value for name, value in before.items() if "seed0" in name}
    assert {name: value[0] for name, value in after.items() if name != "log.txt"} == \
        {name: value[0] for name, value in before.items() if name != "log.txt"}


@pytest.mark.parametrize("job", JOBS)
def test_a_busy_folder_is_refused_with_or_without_overwrite(finished, job, tmp_path, capsys):
    run = copy_of(finished, job, tmp_path)
    before = snapshot(run)
    with run_folder_lock(run):
        for extra in ([], ["--overwrite"]):
            assert main(argv(job, checkpoint_of(run, job), run, *extra)) == 2
            one_error_line(capsys, job, "in use by another convattn run")
    assert snapshot(run) == before


REMOVED_AS_IT_GOES = [  # where a job removes or replaces a folder of its own as it goes -> a user's file there
    pytest.param("seed0/MY_NOTES.txt", id="an interrupted seed"),
    pytest.param("published/NOTES.md", id="a published model"),
]


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("mine", REMOVED_AS_IT_GOES)
def test_a_folder_the_job_removes_holding_the_users_file_is_refused_first(finished, job, tmp_path, capsys, mine):
    """An interrupted seed (no run.json) is removed to start again, a published model replaced by a better
    seed's: only when they hold nothing but the job's files (without --overwrite too)."""
    run = copy_of(finished, job, tmp_path)
    seed = run / JOBS[job]["seeds"] / "seed0"
    (seed / "run.json").unlink()
    task = JOBS[job]["seeds"].split("/")[1]
    where = seed / "MY_NOTES.txt" if mine.startswith("seed0") else run / "models" / task / "NOTES.md"
    where.write_text("mine")
    before = snapshot(run)
    assert main(argv(job, checkpoint_of(run, job), run)) == 2
    one_error_line(capsys, job, str(where.relative_to(run)), "did not write")
    assert snapshot(run) == before
    where.unlink()
    assert main(argv(job, checkpoint_of(run, job), run)) == 0  # the job's own files only: started again
    assert (seed / "run.json").is_file()


def test_the_published_model_follows_the_best_seed_when_it_changes(tmp_path):
    """A rerun that adds seeds (or finishes an interrupted one) can change the best dev seed: models/<task>/ is
    then that seed's model and record, not the earlier best's."""
    from convattn.training.finetune.models import publish_best

    seeds = {}
    for seed in (0, 1):
        model = tmp_path / "runs" / "sst2" / f"seed{seed}" / "model"
        model.mkdir(parents=True)
        (model / "config.json").write_text(json.dumps({"seed": seed}))
        (model / "model.safetensors").write_text(f"weights of seed {seed}")
        seeds[seed] = model.parent

    def published(best: int) -> tuple[dict, str]:
        run = {"scores": {"accuracy": 80.0 + best}, "model": "my-model"}
        target = publish_best(tmp_path, "sst2", seeds, best, run, save_models="all")
        return json.loads((target / "fine_tuned.json").read_text()), (target / "model.safetensors").read_text()

    assert published(0) == ({"task": "sst2", "seed": 0, "scores": {"accuracy": 80.0}, "model": "my-model",
                             "source": str(seeds[0] / "model")}, "weights of seed 0")
    record, weights = published(1)
    assert (record["seed"], record["scores"], weights) == (1, {"accuracy": 81.0}, "weights of seed 1")
