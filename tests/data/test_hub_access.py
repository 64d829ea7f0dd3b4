"""A hub that does not answer is not waited for: datasets load offline (from the cache) at once."""

from __future__ import annotations

import datasets
import pytest
from huggingface_hub import constants

from convattn.data import hub_access


@pytest.fixture
def probe(monkeypatch):
    hub_access.hub_answers.cache_clear()
    yield
    hub_access.hub_answers.cache_clear()


def test_an_unreachable_hub_means_offline_loading(probe, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    class DeadSession:
        def head(self, url, timeout):
            assert timeout <= hub_access.PROBE_SECONDS
            raise ConnectionError("no route to host")

    monkeypatch.setattr("huggingface_hub.get_session", lambda: DeadSession())
    seen = []
    monkeypatch.setattr(datasets, "load_dataset", lambda name: seen.append(
        (name, constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE)) or "loaded")
    result = hub_access.load_hub_dataset("some/dataset")
    assert result == "loaded" and seen == [("some/dataset", True, True)]
    assert constants.HF_HUB_OFFLINE is False  # restored afterwards


def test_offline_mode_is_not_probed(probe, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.get_session", lambda: pytest.fail("probed the network"))
    assert hub_access.hub_answers() is False
