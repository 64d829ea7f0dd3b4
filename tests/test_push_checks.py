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


def test_a_folder_without_its_modeling_code_is_not_uploaded(run_dir, capsys, monkeypatch):
    """A model saved as a checkpoint (no convattn_*.py) would not load on the Hub without convattn."""
    from huggingface_hub import HfApi

    monkeypatch.setattr(HfApi, "create_repo", lambda *a, **k: pytest.fail("the Hub was reached"))
    for code in run_dir.glob("convattn_*.py"):
        code.unlink()
    assert main(["push", str(run_dir), "--repo", "someone/model"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no modeling code" in err and "save it again" in err and "\n" not in err


def test_a_fine_tuned_models_card_is_uploaded_as_it_is(run_dir, monkeypatch):
    from huggingface_hub import HfApi

    from convattn.hub import CARD, FINE_TUNED_RECORD, fine_tuned_card

    record = {"task": "sst2", "seed": 3, "scores": {"accuracy": 91.25, "note": "n/a"}, "model": "runs/composite"}
    (run_dir / FINE_TUNED_RECORD).write_text(json.dumps(record))
    card = fine_tuned_card(run_dir, "sst2", record, "text-classification").read_text()
    assert "- accuracy: 91.25" in card and "note" not in card  # only numbers are scores
    uploaded = {}
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: None)
    monkeypatch.setattr(HfApi, "upload_folder",
                        lambda self, **kw: uploaded.setdefault("card", (run_dir / CARD).read_text()) and "url")
    assert main(["push", str(run_dir), "--repo", "someone/sst2-model"]) == 0
    assert uploaded["card"] == card == (run_dir / CARD).read_text()


def test_network_errors_are_recognised_through_the_chain_and_by_transport():
    """What the Hub client raises depends on its version and transport (requests or httpx), often wrapped in an
    error raised while handling it."""
    from convattn.hub import is_network_error

    def wrapped(inner: BaseException) -> BaseException:
        try:
            try:
                raise inner
            except BaseException:
                raise RuntimeError("upload failed")  # noqa: B904  (an implicit chain: __context__ only)
        except RuntimeError as err:
            return err

    transport_error = type("ConnectError", (Exception,), {"__module__": "httpx._exceptions"})
    assert is_network_error(wrapped(ConnectionError("refused")))
    assert is_network_error(transport_error("no route"))
    assert not is_network_error(wrapped(ValueError("a bug of ours")))
