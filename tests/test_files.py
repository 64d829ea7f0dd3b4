"""convattn.files' promises that its callers' tests reach only in part."""

from __future__ import annotations

import math
import re

import pytest

from convattn.errors import UsageError
from convattn.files import atomic_path, check_weight_file, model_identity, read_json


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit, OSError])
def test_an_interrupted_atomic_write_leaves_the_target_as_it_was_and_no_temporary_file(tmp_path, stop):
    """Ctrl-C (KeyboardInterrupt) or an exit (SystemExit) in mid-write: the case the temporary file exists for."""
    target = tmp_path / "metrics.json"
    target.write_text("before")
    with pytest.raises(stop), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise stop()
    assert list(tmp_path.iterdir()) == [target] and target.read_text() == "before"


def test_read_json_reads_files_only(tmp_path):
    (tmp_path / "config.json").mkdir()
    assert read_json(tmp_path / "config.json") is None and read_json(tmp_path / "absent.json") is None


def test_a_weight_file_is_refused_in_one_line_for_each_way_it_goes_bad(tmp_path):
    import torch
    from safetensors.torch import save_file

    def refusal(tensors: dict) -> str:
        save_file(tensors, tmp_path / "model.safetensors")
        with pytest.raises(UsageError) as err:
            check_weight_file(tmp_path / "model.safetensors")
        return str(err.value)

    infinite = {"a": torch.ones(2), "b": torch.tensor([1.0, -math.inf])}
    assert "non-finite (NaN or infinite) weights: b" in refusal(infinite)
    assert "the weight a is int64 (1 more), not a floating-point type" in refusal(
        {"a": torch.ones(2, dtype=torch.long), "b": torch.ones(2, dtype=torch.int32), "position_ids": torch.arange(2)})
    (tmp_path / "folder.safetensors").mkdir()
    for unreadable in (tmp_path / "absent.safetensors", tmp_path / "folder.safetensors"):
        with pytest.raises(UsageError, match=f"^cannot read {re.escape(str(unreadable))}: "):
            check_weight_file(unreadable)


def test_a_path_that_is_no_folder_stands_for_itself_in_results(tmp_path):
    """A hub id (or a file given by mistake) keys results by its name, never by the hash of nothing."""
    (tmp_path / "model.safetensors").write_bytes(b"x")
    for model in ("bert-base-uncased", str(tmp_path / "model.safetensors")):
        assert model_identity(model) == model
