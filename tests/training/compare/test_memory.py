import pytest
import torch

from convattn.training.compare.memory import saved_activation_bytes


def test_counts_each_saved_storage_once():
    x = torch.randn(1000, dtype=torch.float64, requires_grad=True)
    assert saved_activation_bytes(lambda: (x * x).sum()) == 8000  # mul saves x twice: one storage
    assert saved_activation_bytes(lambda: (x * x).exp().sum()) == 16000  # + exp's output


def test_a_saved_view_keeps_its_whole_storage():
    # what stays alive for backward is the storage a saved slice points into, not the slice's own bytes
    whole = torch.randn(1000, dtype=torch.float64)
    w = torch.randn(10, dtype=torch.float64, requires_grad=True)
    assert saved_activation_bytes(lambda: (whole[:10] * w).sum()) == 8000  # w's gradient needs the 80-byte slice


def test_excluded_storages_are_left_out():
    x = torch.randn(1000, requires_grad=True)
    parameters = {x.untyped_storage().data_ptr()}
    assert saved_activation_bytes(lambda: (x * x).exp().sum(), exclude_storages=parameters) == 4000


def test_the_measured_graph_cannot_run_backward():
    x = torch.randn(10, requires_grad=True)
    graph = []
    saved_activation_bytes(lambda: graph.append(x.exp().sum()))
    with pytest.raises(RuntimeError, match="measurement only"):
        graph[0].backward()

