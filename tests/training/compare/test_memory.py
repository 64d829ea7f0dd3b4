import json
import types

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


def test_a_view_saved_beside_its_base_counts_once():
    # exp saves its output y; the product saves the view y[:500] (y's storage again) and w
    x = torch.randn(1000, dtype=torch.float64, requires_grad=True)
    w = torch.randn(500, dtype=torch.float64, requires_grad=True)

    def forward():
        y = x.exp()
        return (y[:500] * w).sum()

    assert saved_activation_bytes(forward) == 8000 + 4000


class Counted(torch.nn.Module):
    def num_parameters(self) -> int:  # as PreTrainedModel counts them
        return sum(p.numel() for p in self.parameters())


class Encoder(Counted):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)  # 8 parameters


class Toy(Counted):
    """A model whose saved activations are known: exp keeps its output (batch x seq x 5 float32), the product keeps
    that output again and the weight, a parameter. It records the mode and the inputs of each forward."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(vocab_size=50)
        self.convattn = Encoder()
        self.weight = torch.nn.Parameter(torch.randn(5))
        self.calls = []

    def forward(self, **inputs):
        self.calls.append((self.training, inputs))
        hidden = self.weight.expand(*inputs["input_ids"].shape, 5).exp()
        return (hidden * self.weight).sum()


def test_training_memory_measures_one_training_micro_batch(monkeypatch):
    """The estimate's parts on a model whose numbers are known: the micro-batch is the per-device batch (16 over 2
    accumulation steps) x seq_len, given as training gives it (train mode, all tokens attended, one segment, labels
    at the recipe's masked share); its activations leave the parameters out; the state is 16 bytes per parameter."""
    from convattn.training.compare import memory
    from convattn.training.recipes import Recipe

    toy = Toy()
    monkeypatch.setattr(memory, "build_model", lambda recipe, config, tokenizer: toy.eval())
    recipe = Recipe("chang2021-small/composite", batch_size=16, gradient_accumulation=2, seq_len=32,
                    mlm_probability=0.3)
    estimate = memory.training_memory(recipe, tokenizer=None)
    [(training, inputs)] = toy.calls
    assert training
    assert set(inputs) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    ids = inputs["input_ids"]
    assert ids.shape == (8, 32) and int(ids.min()) >= 0 and int(ids.max()) < 50
    assert bool((inputs["attention_mask"] == 1).all()) and bool((inputs["token_type_ids"] == 0).all())
    labels = inputs["labels"]
    masked = labels != -100
    assert torch.equal(labels[masked], ids[masked]) and 0.2 < masked.float().mean().item() < 0.4
    parameters = 8 + 5
    activations = 8 * 32 * 5 * 4
    assert estimate == {"parameters": parameters, "encoder_parameters": 8, "micro_batch": [8, 32],
                        "state_bytes": 16 * parameters, "activation_bytes": activations,
                        "total_bytes": 16 * parameters + activations}


def test_memory_is_measured_once_per_recipe_and_keeps_every_seeds_peak(tmp_path, monkeypatch):
    """A comparison continued later trains its remaining seeds alone: their CUDA peaks join the earlier seeds', and
    the estimate is not measured again; a changed recipe measures again, and the old recipe's peaks go."""
    from convattn.training.compare import memory
    from convattn.training.compare.grids import Grid, RunSpec
    from convattn.training.compare.options import MEMORY_FILE, CompareOptions

    measured = []
    monkeypatch.setattr(memory, "training_memory",
                        lambda recipe, tokenizer: measured.append(recipe.batch_size) or {"batch": recipe.batch_size})
    spec = RunSpec("bert", "chang2021-small/absolute")
    options = CompareOptions(Grid("g", [spec]), tmp_path, data={}, seeds=3, training={"batch_size": 8})
    path = options.run_path(spec) / MEMORY_FILE
    memory.update_memory(options, spec, None, {0: 100})
    memory.update_memory(options, spec, None, {})  # every seed reused
    memory.update_memory(options, spec, None, {1: 300, 2: 200})
    record = json.loads(path.read_text())
    assert measured == [8] and record["estimate"] == {"batch": 8}
    assert record["cuda_peak_bytes"] == {"0": 100, "1": 300, "2": 200}
    assert record["recipe"]["batch_size"] == 8 and "seed" not in record["recipe"]
    options.training = {"batch_size": 16}
    memory.update_memory(options, spec, None, {0: 400})
    record = json.loads(path.read_text())
    assert measured == [8, 16] and record["estimate"] == {"batch": 16} and record["cuda_peak_bytes"] == {"0": 400}
