"""Which computation attention with relative terms takes (attention/relative/dispatch.py), and FlexAttention's."""

from __future__ import annotations

import contextlib
import threading
import warnings
from types import SimpleNamespace

import pytest
import torch
from helpers.reference import composite_attention_loops
from helpers.relative import TERMS, batch, make_layer, output_and_grads

from convattn.attention import TokenMask
from convattn.attention.relative import RelativePositionBias, dispatch, flex

SHORT, LONG, LONGEST = dispatch.CPU_DECOMPOSED_MIN_LENGTH - 1, dispatch.CPU_DECOMPOSED_MIN_LENGTH, \
    dispatch.CPU_BLOCKWISE_MIN_LENGTH


@pytest.mark.parametrize("n, d, dtype, implementation, dropout_p, need_weights, path", [
    (LONG, 64, torch.float32, "sdpa", 0.0, False, "decomposed"),
    (LONG, 64, torch.bfloat16, "sdpa", 0.0, False, "decomposed"),
    (LONG, 64, torch.float64, "sdpa", 0.0, False, "decomposed"),
    (SHORT, 64, torch.float32, "sdpa", 0.0, False, "dense"),  # as fast, and small
    (LONG, 64, torch.float32, "sdpa", 0.0, True, "dense"),  # attention maps
    (LONG, 64, torch.float32, "eager", 0.0, False, "dense"),
    (LONG, 64, torch.float32, "sdpa", 0.1, False, "dense"),  # dropout: the CPU kernel has none
    (LONGEST, 64, torch.float32, "sdpa", 0.1, False, "blockwise"),
    (LONG, 16, torch.float32, "flex_attention", 0.0, False, "flex"),
    (LONG, 8, torch.float32, "flex_attention", 0.0, False, "dense"),  # its kernel needs 16 channels
    (LONG, 16, torch.float32, "flex_attention", 0.1, False, "dense"),  # it has no dropout
    (SHORT, 64, torch.float32, "convattn_triton", 0.1, False, "triton"),  # by name, any length, dropout too
    (LONG, 64, torch.float32, "convattn_triton", 0.0, True, "dense"),  # attention maps
])
def test_cpu_paths(n, d, dtype, implementation, dropout_p, need_weights, path):
    q = torch.empty(1, 1, n, d, dtype=dtype)
    assert dispatch.relative_path(q, implementation, dropout_p, need_weights) == path


def operands_on(device: str, dtype: torch.dtype, n: int = LONG, d: int = 64) -> SimpleNamespace:
    """What `relative_path` reads of q (its shape, device and dtype), on a device this machine need not have."""
    return SimpleNamespace(shape=(1, 1, n, d), device=torch.device(device), dtype=dtype)


@pytest.mark.parametrize("dtype, triton, dropout_p, path", [
    (torch.float32, True, 0.0, "triton"),  # the default wherever triton is installed, any length, dropout too
    (torch.bfloat16, True, 0.1, "triton"),
    (torch.float16, True, 0.0, "triton"),
    (torch.float64, True, 0.0, "dense"),  # neither the kernel nor CUDA's flash kernels have float64
    (torch.float64, False, 0.1, "dense"),
    (torch.float32, False, 0.0, "decomposed"),  # without triton: the decomposition on CUDA's flash kernels
    (torch.bfloat16, False, 0.1, "decomposed"),  # which have dropout
])
def test_cuda_paths(dtype, triton, dropout_p, path, monkeypatch):
    monkeypatch.setattr(dispatch, "triton_installed", lambda: triton)
    for n in (SHORT, LONG, LONGEST):
        assert dispatch.relative_path(operands_on("cuda", dtype, n), "sdpa", dropout_p, False) == path, n


def test_a_device_without_fused_kernels_takes_the_dense_bias():
    """Apple's GPUs (mps): no fused kernel serves the decomposition there, at any length."""
    for n in (SHORT, LONG, LONGEST):
        assert dispatch.relative_path(operands_on("mps", torch.float32, n), "sdpa", 0.0, False) == "dense"


def test_a_forced_path_holds_in_its_own_thread_only():
    q = torch.empty(1, 1, LONG, 64)
    forced, checked, taken = threading.Event(), threading.Event(), []

    def force_and_wait():
        with dispatch.forced_path("blockwise"):
            taken.append(dispatch.relative_path(q, "sdpa", 0.0, False))
            forced.set()
            checked.wait(timeout=60)

    thread = threading.Thread(target=force_and_wait)
    thread.start()
    try:
        assert forced.wait(timeout=60)
        with dispatch.forced_path("dense"):
            assert dispatch.relative_path(q, "sdpa", 0.0, False) == "dense"
        assert dispatch.relative_path(q, "sdpa", 0.0, False) == "decomposed"
    finally:
        checked.set()
        thread.join()
    assert taken == ["blockwise"]


@pytest.mark.parametrize("forced", [path for path in dispatch.RELATIVE_PATHS if path != "dense"])
def test_a_forced_path_gives_way_where_the_probabilities_are_asked_for(forced):
    """Only the dense bias gives the attention probabilities (output_attentions), and "eager" names it: a forced path
    holds everywhere else."""
    q = torch.empty(1, 1, LONG, 64)
    with dispatch.forced_path(forced):
        assert dispatch.relative_path(q, "sdpa", 0.0, True) == "dense"
        assert dispatch.relative_path(q, "eager", 0.0, False) == "dense"
        assert dispatch.relative_path(q, "sdpa", 0.0, False) == forced


def test_a_compiled_graph_follows_the_forced_path():
    """fullgraph: reading the forced path breaks no graph, and its guard recompiles when the path changes."""
    def path_taken(q):
        return q.new_full((), dispatch.RELATIVE_PATHS.index(dispatch.relative_path(q, "sdpa", 0.0, False)))

    compiled = torch.compile(path_taken, fullgraph=True, backend="eager")
    q = torch.zeros(1, 1, LONG, 64)
    paths = [compiled(q)]
    with dispatch.forced_path("dense"):
        paths.append(compiled(q))
    paths.append(compiled(q))
    assert [dispatch.RELATIVE_PATHS[int(p)] for p in paths] == ["decomposed", "dense", "decomposed"]


def test_a_compiled_graph_with_dropout_keeps_the_dense_bias_past_the_blockwise_length():
    """The blockwise path's activation checkpoints would split a compiled graph: compiled code with dropout takes the
    dense bias at every length, eager code the blocks from CPU_BLOCKWISE_MIN_LENGTH on."""
    def path_taken(q):
        return q.new_full((), dispatch.RELATIVE_PATHS.index(dispatch.relative_path(q, "sdpa", 0.1, False)))

    q = torch.zeros(1, 1, LONGEST, 64)
    compiled = torch.compile(path_taken, fullgraph=True, backend="eager")
    assert dispatch.RELATIVE_PATHS[int(compiled(q))] == "dense"
    assert dispatch.RELATIVE_PATHS[int(path_taken(q))] == "blockwise"


@pytest.mark.parametrize("implementation, relative, forced, packed", [
    ("sdpa", True, None, True),  # the default where the kernel serves
    ("sdpa", False, None, False),  # no terms: SDPA on blocks
    ("sdpa", True, "triton", False),  # a forced path runs on padded blocks, the kernel's too
    ("sdpa", True, "decomposed", False),
    ("eager", True, None, False),
    ("flex_attention", True, None, False),
    ("convattn_triton", False, None, True),  # by name: always
    ("convattn_triton", True, "decomposed", True),
])
def test_packed_sequences_take_the_kernel_where_a_padded_batch_would(implementation, relative, forced, packed,
                                                                     monkeypatch):
    """On a machine where the kernel is the default (`_triton_serves` stands in for CUDA and triton)."""
    monkeypatch.setattr(dispatch, "_triton_serves", lambda name, device, dtype: True)
    query = torch.empty(1, LONG, 64)
    bias = RelativePositionBias(TERMS["composite"], 4, 64, 3, "clip") if relative else None
    with dispatch.forced_path(forced) if forced else contextlib.nullcontext():
        assert dispatch._packed_kernel_serves(query, bias, implementation, 0.0) is packed


@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
@pytest.mark.parametrize("terms", list(TERMS))
def test_flex_forward_matches_loop_reference_on_cpu(terms, out_of_window, monkeypatch):
    """torch 2.13 has no CPU backward for flex_attention: the forward only, eagerly, without grad."""
    layer = make_layer(TERMS[terms], out_of_window, hidden_size=64, attn_implementation="flex_attention").eval()
    x, keep = batch((13, 7, 1), 13, torch.float32, width=64)
    calls = []
    monkeypatch.setattr(dispatch, "flex_relative_attention",
                        lambda *args: calls.append(1) or flex.flex_relative_attention(*args))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention's "eager mode is unoptimised" notice
        ours = layer(x, TokenMask(keep))[0].double()
    assert calls, "the flex path was not taken"
    expected = composite_attention_loops(layer, x.detach(), keep)
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's compiled kernel and backward need CUDA")
@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
@pytest.mark.parametrize("terms", list(TERMS))
def test_flex_on_cuda_outputs_and_all_gradients_match_loop_reference(terms, out_of_window):
    """The compiled FlexAttention kernel with heads of 16, its smallest."""
    layer = make_layer(TERMS[terms], out_of_window, hidden_size=64, value_depthwise_conv=True,
                       attn_implementation="flex_attention")
    x, keep = batch((13, 7, 1), 13, torch.float32, width=64)
    expected, ref_grads = output_and_grads(layer, x, keep, lambda x, keep: composite_attention_loops(layer, x, keep))
    layer.cuda()
    ours, our_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x.cuda(), TokenMask(keep.cuda()))[0].cpu())
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-5, atol=1e-5)
    names = ["input", *(name for name, _ in layer.named_parameters())]
    scale = max(want.abs().max().item() for want in ref_grads)
    for name, got, want in zip(names, our_grads, ref_grads, strict=True):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5 * scale,
                                   msg=lambda m, name=name: f"{name}: {m}")
