"""Which checkpoint a run resumes from (the complete ones, by step; a torch file that reads back whole), and what a
checkpoint's trainer state says of a callback, read by one reader (`saved_callback_state`)."""

from __future__ import annotations

import json

import pytest
import torch

from convattn.files import read_json
from convattn.runs.checkpoints import is_whole, saved_callback_state
from convattn.runs.pretrain import TRAINER_STATE, complete_checkpoints

CLOCK = {"args": {"budget": 60.0}, "attributes": {"spent": 12.5}}


@pytest.mark.parametrize(("state", "saved"), [
    ({"stateful_callbacks": {"TrainingClock": CLOCK}}, CLOCK),
    ({"stateful_callbacks": {"TrainingClock": [{"args": {}, "attributes": {}}, CLOCK]}}, CLOCK),  # several: the last
    ({"stateful_callbacks": {}}, {}),  # written before it was recorded
    ({}, {}),
    ({"stateful_callbacks": {"TrainingClock": []}}, {}),
    ({"stateful_callbacks": {"TrainingClock": "12.5"}}, {}),
    ([], {}),
])
def test_a_callbacks_saved_state_is_read_from_the_trainer_state(tmp_path, state, saved):
    (tmp_path / TRAINER_STATE).write_text(json.dumps(state))
    assert saved_callback_state(tmp_path, "TrainingClock") == saved


def test_a_damaged_or_missing_trainer_state_says_nothing(tmp_path):
    assert saved_callback_state(tmp_path, "TrainingClock") == {}
    (tmp_path / TRAINER_STATE).write_text('{"stateful_callbacks": ')
    assert saved_callback_state(tmp_path, "TrainingClock") == {}


def test_read_json_names_damage_unless_asked_for_none(tmp_path):
    file = tmp_path / "state.json"
    assert read_json(file) is None and read_json(file, damaged_as_none=True) is None
    file.write_bytes(b"\xff{")
    with pytest.raises(ValueError):
        read_json(file)
    assert read_json(file, damaged_as_none=True) is None
    file.write_text("[1]")
    assert read_json(file) == [1] == read_json(file, damaged_as_none=True)
    assert read_json(tmp_path, damaged_as_none=True) is None  # a folder is no file


def test_a_run_resumes_from_its_latest_complete_checkpoint_by_step_not_by_name(tmp_path):
    for step in (250, 500, 1000, 1250):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if step != 1250:  # killed before its trainer state was written: not complete
            (tmp_path / f"checkpoint-{step}" / TRAINER_STATE).write_text("{}")
    (tmp_path / "checkpoint-750-tmp").mkdir()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["checkpoint-250", "checkpoint-500", "checkpoint-1000"]


def test_a_torch_file_whose_bytes_changed_is_not_whole(tmp_path):
    """A torch checkpoint file (optimizer.pt, rng_state.pth) is a zip archive: one flipped byte in a tensor's data
    fails its CRC, which only reading every member finds (the archive's directory still opens)."""
    file = tmp_path / "optimizer.pt"
    torch.save({"exp_avg": torch.arange(4096, dtype=torch.int32)}, file)
    assert is_whole(file)
    data = bytearray(file.read_bytes())
    at = data.find(torch.arange(100, 104, dtype=torch.int32).numpy().tobytes())
    data[at] ^= 0xFF
    file.write_bytes(bytes(data))
    assert not is_whole(file)
    file.write_bytes(bytes(data[: len(data) // 2]))  # cut short
    assert not is_whole(file)
