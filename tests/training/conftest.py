import pytest


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    """No hub, and one convattn cache for the whole session (tokenizers and formatted data are reused)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CONVATTN_CACHE", str(tmp_path_factory.getbasetemp() / "convattn-cache"))

