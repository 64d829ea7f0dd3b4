"""`convattn push` checks the folder before anything is uploaded (no network is touched here)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny import tiny_config

from convattn import ConvAttnForMaskedLM
from convattn.cli import main


@pytest.fixture
def run_dir(tmp_path):
    torch.manual_seed(0)
    ConvAttnForMaskedLM(tiny_config("chang2021-small/composite")).save_pretrained(tmp_path / "run")
    return tmp_path / "run"


def test_a_config_with_unknown_fields_is_not_uploaded(run_dir, capsys, monkeypatch):
    import convattn.hub

    monkeypatch.setattr(convattn.hub, "push", lambda *a, **k: pytest.fail("push reached"))
    config = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**config, "bogus": 1}))
    assert main(["push", str(run_dir), "--repo", "someone/model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("convattn push: error: ") and "bogus" in err and "\n" not in err
    assert main(["push", str(run_dir / "config.json"), "--repo", "someone/model"]) == 2
    assert "is not a folder" in capsys.readouterr().err
