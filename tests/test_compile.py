"""torch.compile: a training step of every attention family is one graph, and computes what eager mode does."""

from __future__ import annotations

import pytest
import torch
from functorch.compile import make_boxed_func
from helpers.tiny import randomize_, tiny_config
from torch._dynamo.backends.common import aot_autograd

from convattn import ConvAttnForMaskedLM
from convattn.attention.relative.dispatch import CPU_DECOMPOSED_MIN_LENGTH
from convattn.electra import ConvAttnForPreTraining
from convattn.losses import MLM_REDUCTIONS, fixed_shape_masked_lm_loss, masked_lm_loss
from convattn.training.execution import compile_arguments

pytestmark = pytest.mark.slow  # Inductor compiles for seconds per test
ELECTRA = "electra"
# family -> (preset, sequence length); one row per attention code path
FAMILIES = {
    "bert": ("chang2021-small/absolute", 24),
    "composite+key": ("chang2021-small/composite+key", 24),
    # the decomposed kernels from this length on, eager and compiled (one custom operator)
    "composite+key-long": ("chang2021-small/composite+key", CPU_DECOMPOSED_MIN_LENGTH),
    "composite+depthwise": ("chang2021-small/composite+depthwise", 24),
    "composite+conv-qkv": ("chang2021-small/composite+conv-qkv", 24),
    "convbert": ("convbert/small", 24),
    "convbert-key-kernels": ("chang2021-small/convbert", 24),
    "rotary": ("chang2021-small/composite+rotary", 24),
    "alibi": ("chang2021-small/alibi", 24),
    # ALiBi alone without dropout: the Toeplitz view from this length on, every row's pads on the extra channel
    "alibi-long": ("chang2021-small/alibi", CPU_DECOMPOSED_MIN_LENGTH),
    "linformer": ("malard/linformer-n128-k32", 24),
    "conv-linformer": ("malard/conv-linformer-n128-k32", 24),
    ELECTRA: ("convbert/small", 24),
}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def tiny_model(family: str, dropout: float = 0.0, **overrides) -> torch.nn.Module:
    preset, _ = FAMILIES[family]
    fields = dict(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, **overrides)
    if family == ELECTRA:
        fields.update(mask_token_id=4, pad_token_id=0)
    torch.manual_seed(0)
    model = (ConvAttnForPreTraining if family == ELECTRA else ConvAttnForMaskedLM)(tiny_config(preset, **fields))
    randomize_(model)
    return model.train()


def padded_batch(n: int) -> dict[str, torch.Tensor]:
    """Three rows, two of them padded; a fifth of the positions labelled."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 101, (3, n), generator=generator)
    keep = torch.ones(3, n, dtype=torch.long)
    keep[1, n - 5:] = 0
    keep[2, n // 2:] = 0
    labels = torch.full((3, n), -100)
    labels[:, 1::5] = ids[:, 1::5]
    return {"input_ids": ids, "attention_mask": keep, "labels": labels.masked_fill(keep == 0, -100)}


def model_inputs(family: str, batch: dict) -> dict:
    if family == ELECTRA:  # masks and labels are drawn inside the model
        return {k: v for k, v in batch.items() if k != "labels"}
    return {**batch, "return_logits": False}  # as pretraining calls it


def training_step(model, inputs: dict) -> torch.Tensor:
    loss = model(**inputs).loss
    loss.backward()
    return loss.detach()


def loss_and_gradients(model, step_model, inputs: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # ELECTRA's masks and samples
    loss = training_step(step_model, inputs)
    return loss, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_training_step_is_one_graph_without_breaks(family):
    """Forward, loss and backward of a padded batch with dropout on, traced as one graph (one layer: they are
    all alike)."""
    model = tiny_model(family, dropout=0.1, num_hidden_layers=1)
    inputs = model_inputs(family, padded_batch(FAMILIES[family][1]))
    with torch._dynamo.config.patch(trace_autograd_ops=True):  # loss.backward() inside the traced step
        explanation = torch._dynamo.explain(training_step)(model, inputs)
    assert [str(b.reason).splitlines()[0] for b in explanation.break_reasons] == []
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_compiled_loss_and_gradients_match_eager(family):
    """The model compiled as the Trainer does (torch.compile(model)), whole-graph, through AOTAutograd."""
    model = tiny_model(family)
    inputs = model_inputs(family, padded_batch(FAMILIES[family][1]))
    eager_loss, eager_grads = loss_and_gradients(model, model, inputs)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    loss, grads = loss_and_gradients(model, compiled, inputs)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == eager_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def compiled_with_a_record(family: str, n: int):
    """One layer of `family` on a padded batch of n tokens, eager and compiled whole-graph through AOTAutograd:
    the operators of the compiled forward and backward, the (shape, storage elements) of every tensor they hold,
    and the eager and compiled (loss, gradients)."""
    model = tiny_model(family, num_hidden_layers=1, max_position_embeddings=n)
    inputs = model_inputs(family, padded_batch(n))
    eager = loss_and_gradients(model, model, inputs)
    targets, tensors = set(), []

    def record(graph_module, example_inputs):
        for node in graph_module.graph.nodes:
            targets.add(str(node.target))
            values = node.meta.get("val")
            for value in values if isinstance(values, list | tuple) else [values]:
                if isinstance(value, torch.Tensor):
                    tensors.append((tuple(value.shape), value.untyped_storage().nbytes() // value.element_size()))
        return make_boxed_func(graph_module.forward)

    backend = aot_autograd(fw_compiler=record, bw_compiler=record)
    compiled = loss_and_gradients(model, torch.compile(model, backend=backend, fullgraph=True), inputs)
    return targets, tensors, eager, compiled


def assert_same_loss_and_gradients(compiled, eager):
    (loss, grads), (eager_loss, eager_grads) = compiled, eager
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_compiled_relative_terms_take_the_decomposition_and_no_n_by_n_tensor():
    """Past one block of queries the compiled forward and backward hold the decomposition's operators and no
    tensor with two axes of the sequence's length, and compute what eager mode does."""
    n = 600
    targets, tensors, eager, compiled = compiled_with_a_record("composite+key", n)
    assert {"convattn.relative_attention.default", "convattn.relative_attention_backward.default"} <= targets
    assert tensors and not [shape for shape, _ in tensors if sum(size >= n for size in shape) >= 2]
    assert_same_loss_and_gradients(compiled, eager)


def test_compiled_alibi_keeps_its_bias_a_view_of_its_diagonals():
    """ALiBi alone without dropout, past the dense bias's lengths: the compiled forward and backward call the CPU flash
    kernel with the bias as a strided view, no storage of n x n numbers, and compute what eager mode does."""
    torch.set_flush_denormal(True)  # as the command line runs (conftest gives the state back)
    n = 600
    targets, tensors, eager, compiled = compiled_with_a_record("alibi", n)
    assert {"aten._scaled_dot_product_flash_attention_for_cpu.default",
            "aten._scaled_dot_product_flash_attention_for_cpu_backward.default", "aten.as_strided.default"} <= targets
    assert tensors and max(elements for _, elements in tensors) < n * n
    assert_same_loss_and_gradients(compiled, eager)


def test_the_triton_kernel_is_one_operator_in_a_compiled_step():
    """attn_implementation="convattn_triton" (the CUDA default; the interpreter here): with dropout one graph, its
    seed drawn inside it; without, the kernel's two operators in the forward and backward graphs, and what eager
    mode computes."""
    # two heads and one query tile of the interpreter's 16: it runs the kernel three times, each launch seconds
    fields = dict(num_hidden_layers=1, num_attention_heads=2, attn_implementation="convattn_triton")
    model = tiny_model("composite+key", dropout=0.1, **fields)
    inputs = model_inputs("composite+key", padded_batch(16))
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        explanation = torch._dynamo.explain(training_step)(model, inputs)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)
    torch._dynamo.reset()
    model = tiny_model("composite+key", **fields)
    eager_loss, eager_grads = loss_and_gradients(model, model, inputs)
    targets = set()

    def record(graph_module, example_inputs):
        targets.update(str(node.target) for node in graph_module.graph.nodes)
        return make_boxed_func(graph_module.forward)

    backend = aot_autograd(fw_compiler=record, bw_compiler=record)
    loss, grads = loss_and_gradients(model, torch.compile(model, backend=backend, fullgraph=True), inputs)
    assert {"convattn.triton_relative_attention.default",
            "convattn.triton_relative_attention_backward.default"} <= targets
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernels need a CUDA GPU")
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_inductor_compiles_relative_attention_on_cuda(dropout):
    """The fused kernel's operators (the CUDA default) under inductor: without dropout what eager mode computes;
    with it, a finite loss and finite gradients."""
    n = 600
    model = tiny_model("composite+key", dropout=dropout, num_hidden_layers=1, max_position_embeddings=n).cuda()
    inputs = {key: value.cuda() if isinstance(value, torch.Tensor) else value
              for key, value in model_inputs("composite+key", padded_batch(n)).items()}
    loss, grads = loss_and_gradients(model, torch.compile(model, fullgraph=True), inputs)
    if dropout:
        assert torch.isfinite(loss) and all(torch.isfinite(grad).all() for grad in grads.values())
        return
    eager_loss, eager_grads = loss_and_gradients(model, model, inputs)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-4, atol=1e-4)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU inductor (on a GPU its fused generator draws dropout)")
@pytest.mark.parametrize("n", [16, CPU_DECOMPOSED_MIN_LENGTH])  # the dense bias, the decomposition's operator
def test_inductor_compiles_a_composite_training_step(n):
    """One real inductor compile (C++ kernels on CPU, ~30 s cold), one layer to keep it short. With dropout on:
    compiled as the commands compile (`compile_arguments`), dropout draws the masks an eager run draws, so the same
    seed gives the same loss on a batch both compute padded (inductor's own generator gave other masks, issue 64;
    a batch mostly padding runs padding-free in eager mode, and the run's record says so: `compile_difference`)."""
    model = tiny_model("composite+key", dropout=0.1, num_hidden_layers=1)
    batch = padded_batch(n)
    batch["attention_mask"][2] = 1  # over 90% real tokens: eager mode runs it padded too, as compiled code does
    batch["attention_mask"][1, :-1] = 1
    batch["labels"] = batch["labels"].masked_fill(batch["attention_mask"] == 0, -100)
    inputs = model_inputs("composite+key", batch)
    eager_loss, eager_grads = loss_and_gradients(model, model, inputs)
    with torch._inductor.config.patch(fallback_random=False):  # as a process starts; restored after the test
        compile_arguments("default")
        loss, grads = loss_and_gradients(model, torch.compile(model, fullgraph=True), inputs)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("labelled", ["a fifth", "all"])
@pytest.mark.parametrize("reduction", MLM_REDUCTIONS)
def test_fixed_shape_masked_lm_loss_equals_the_eager_one(reduction, labelled):
    """The compiled path's loss (the head on a quarter of the positions, or on all of them when more are scored)
    against eager's (the head on the scored positions only), with a row that has no scored token."""
    model = tiny_model("composite+key")
    batch = padded_batch(24)
    labels = batch["labels"] if labelled == "a fifth" else batch["input_ids"].clone()
    labels[1] = -100
    hidden = model.convattn(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    eager = masked_lm_loss(model.mlm_head, hidden, labels, reduction)
    fixed = fixed_shape_masked_lm_loss(model.mlm_head, hidden, labels, reduction)  # torch.cond runs eagerly too
    assert fixed.dtype == eager.dtype and fixed.shape == eager.shape
    torch.testing.assert_close(fixed, eager, rtol=1e-6, atol=1e-6)


def test_compiled_loss_matches_eager_when_most_positions_are_labelled():
    """More scored positions than the head's fixed rows: the graph's other branch, the head on every position."""
    model = tiny_model("bert")
    batch = padded_batch(24)
    inputs = model_inputs("bert", {**batch, "labels": batch["input_ids"].masked_fill(batch["attention_mask"] == 0,
                                                                                      -100)})
    eager_loss, eager_grads = loss_and_gradients(model, model, inputs)
    loss, grads = loss_and_gradients(model, torch.compile(model, backend="aot_eager", fullgraph=True), inputs)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
