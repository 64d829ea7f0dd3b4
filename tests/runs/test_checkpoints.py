"""What a checkpoint's trainer state says of a callback, read by one reader (`saved_callback_state`)."""

from __future__ import annotations

import json

import pytest

from convattn.files import read_json
from convattn.runs.checkpoints import saved_callback_state
from convattn.runs.pretrain import TRAINER_STATE

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
