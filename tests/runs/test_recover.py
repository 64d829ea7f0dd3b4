"""What the next run of a job does with what a killed --overwrite left in its folder (`recover_replaced_run`): a
replacement that stands keeps its place and the old run goes; one that does not gives the old run back; a folder
aside that is another job's is left as it is. And what a --resume reads its options from meanwhile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.trees import finished_run, tree, write_files

from convattn.runs.finetune import layout
from convattn.runs.folder import REPLACED
from convattn.runs.pretrain import PRETRAIN
from convattn.runs.replace import recover_replaced_run, replaced_record

LAYOUTS = {"glue": layout("glue"), "squad": layout("squad"), "pretrain": PRETRAIN}
# what each job's replacement has written once it stands: its first checkpoint, or its first finished seed
STANDING = {
    "pretrain": {"pretrain_options.json": '{"new": 1}', "checkpoints/checkpoint-1/trainer_state.json": "{}",
                 "checkpoints/checkpoint-1/model.safetensors": "new weights"},
    "glue": {"glue_model.json": '{"new": 1}', "runs/sst2/seed0/run.json": "{}"},
    "squad": {"squad_model.json": '{"new": 1}', "runs/squad1.1/seed0/run.json": "{}"},
}
# the same replacement killed before it stood: its record written, its first checkpoint or seed begun, not done
UNSTANDING = {
    "pretrain": {"pretrain_options.json": '{"new": 1}', "checkpoints/checkpoint-1/model.safetensors": "partial"},
    "glue": {"glue_model.json": '{"new": 1}', "runs/sst2/seed0/log.json": "[]"},
    "squad": {"squad_model.json": '{"new": 1}', "runs/squad1.1/seed0/log.json": "[]"},
}


def killed_replacement(out: Path, job: str, written: dict[str, str]) -> Path:
    """A finished run of `job` moved aside by --overwrite, and the replacement's files written before its kill."""
    old = finished_run(out / REPLACED, job)
    return write_files(old.parent, written)


@pytest.mark.parametrize("job", ["pretrain", "glue", "squad"])
def test_a_replacement_that_stood_keeps_its_place_and_the_old_run_goes(tmp_path, job):
    out = killed_replacement(tmp_path / "run", job, STANDING[job])
    recover_replaced_run(out, LAYOUTS[job])
    assert tree(out) == tree(write_files(tmp_path / "expected", STANDING[job]))


@pytest.mark.parametrize("job", ["pretrain", "glue", "squad"])
def test_a_replacement_that_did_not_stand_gives_the_old_run_back(tmp_path, job):
    out = killed_replacement(tmp_path / "run", job, UNSTANDING[job])
    recover_replaced_run(out, LAYOUTS[job])
    assert tree(out) == tree(finished_run(tmp_path / "expected", job))


@pytest.mark.parametrize(("job", "other"), [("pretrain", "glue"), ("glue", "pretrain"), ("squad", "glue")])
def test_another_jobs_folder_aside_is_left_as_it_is(tmp_path, job, other):
    out = killed_replacement(tmp_path / "run", other, UNSTANDING[other])
    before = tree(tmp_path)
    recover_replaced_run(out, LAYOUTS[job])
    assert tree(tmp_path) == before


def test_a_resume_reads_the_options_of_the_run_it_will_continue(tmp_path):
    out = tmp_path / "run"
    killed_replacement(out, "pretrain", UNSTANDING["pretrain"])
    (out / REPLACED / "pretrain_options.json").write_text('{"old": 1}')
    assert json.loads(replaced_record(out, PRETRAIN).read_text()) == {"old": 1}  # the run given back on resuming
    killed_replacement(tmp_path / "stood", "pretrain", STANDING["pretrain"])
    assert json.loads(replaced_record(tmp_path / "stood", PRETRAIN).read_text()) == {"new": 1}
