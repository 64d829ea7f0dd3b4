import pytest


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    """No hub, and one convattn cache for the whole session (tokenizers and formatted data are reused)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CONVATTN_CACHE", str(tmp_path_factory.getbasetemp() / "convattn-cache"))


@pytest.fixture
def one_thread():
    """One intra-op thread: on 2 shared cores OpenMP spin-waits against other processes (~50x slower for the
    tiny fine-tuning runs)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
