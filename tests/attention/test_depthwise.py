"""Depthwise convolution along the sequence (attention/depthwise.py) against the float64 loop reference:
output and the gradients of input, weight and bias, with kernels whose weight gradient comes in one, two and
three pieces on CPU, and as a traced graph computes it (the module's Conv1d); which convolutions serve, and that
each gradient is computed only where asked."""

from __future__ import annotations

import pytest
import torch
from helpers.reference import depthwise_conv_loops
from torch.utils._python_dispatch import TorchDispatchMode

from convattn.attention import depthwise
from convattn.attention.depthwise import depthwise_over_tokens

TAPS = depthwise.WEIGHT_GRAD_TAPS


def output_and_grads(forward, x, conv, weights):
    out = forward(x)
    grads = torch.autograd.grad((out.double() * weights).sum(), [x, *conv.parameters()])
    return out.double(), [g.double() for g in grads]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "as traced (the module's Conv1d)"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kernel", [1, 3, TAPS, TAPS + 2, 17, 2 * TAPS + 3])
def test_outputs_and_all_gradients_match_loop_reference(kernel, bias, dtype, traced, monkeypatch):
    if traced:
        monkeypatch.setattr(depthwise, "is_tracing", lambda: True)
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(6, 6, kernel, groups=6, padding=kernel // 2, bias=bias).to(dtype)
    x = torch.randn(3, 13, 6, dtype=dtype, requires_grad=True)  # odd n, shorter than some kernels' reach twice
    weights = torch.randn(3, 13, 6, dtype=torch.float64)
    ours, our_grads = output_and_grads(lambda x: depthwise_over_tokens(conv, x), x, conv, weights)
    expected, ref_grads = output_and_grads(lambda x: depthwise_conv_loops(x, conv.weight, conv.bias), x, conv, weights)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(ours, expected, rtol=tolerance, atol=tolerance)
    for got, want in zip(our_grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("kernel", [3, 17])
def test_gradients_only_where_asked(kernel):
    """A frozen convolution (weights without gradients) still passes the gradient to its input, and a
    constant input still gives the weights theirs."""
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(4, 4, kernel, groups=4, padding=kernel // 2).double()
    x = torch.randn(2, 9, 4, dtype=torch.float64)
    conv.requires_grad_(False)
    x.requires_grad_()
    (grad_x,) = torch.autograd.grad(depthwise_over_tokens(conv, x).sum(), [x])
    (want,) = torch.autograd.grad(depthwise_conv_loops(x, conv.weight, conv.bias).sum(), [x])
    torch.testing.assert_close(grad_x, want)
    conv.requires_grad_(True)
    x = x.detach()
    grads = torch.autograd.grad(depthwise_over_tokens(conv, x).sum(), list(conv.parameters()))
    wants = torch.autograd.grad(depthwise_conv_loops(x, conv.weight, conv.bias).sum(), list(conv.parameters()))
    for got, want in zip(grads, wants, strict=True):
        torch.testing.assert_close(got, want)


class Convolutions(TorchDispatchMode):
    """The convolution operators called, each as (name, rank of its input)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            self.calls.append(("convolution", args[0].dim()))
        elif func is torch.ops.aten.convolution_backward.default:
            self.calls.append(("convolution_backward", args[1].dim()))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "as traced"])
def test_cpu_convolves_the_channels_last_view_and_a_traced_graph_keeps_the_conv1d(traced, monkeypatch):
    """Eager on CPU, the output and both gradients are conv2d of the (batch, channels, 1, n) view (4-d operands):
    the output, the input's gradient as a convolution of the output's gradient, the weight's in pieces of at most
    WEIGHT_GRAD_TAPS taps. A traced graph keeps the module's own Conv1d: one convolution forward, one backward, on
    3-d operands."""
    if traced:
        monkeypatch.setattr(depthwise, "is_tracing", lambda: True)
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(4, 4, 17, groups=4, padding=8).double()
    x = torch.randn(2, 9, 4, dtype=torch.float64, requires_grad=True)
    with Convolutions() as recorded:
        depthwise_over_tokens(conv, x).sum().backward()
    if traced:
        assert recorded.calls == [("convolution", 3), ("convolution_backward", 3)]
    else:
        pieces = -(-17 // TAPS)
        assert recorded.calls == [("convolution", 4)] * 2 + [("convolution_backward", 4)] * pieces


def test_a_gradient_not_asked_for_is_not_computed():
    """A frozen convolution makes no weight gradient (no convolution_backward, the costly one for wide kernels), a
    constant input no input gradient (no convolution beside the forward one)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(4, 4, 17, groups=4, padding=8).double().requires_grad_(False)
    x = torch.randn(2, 9, 4, dtype=torch.float64, requires_grad=True)
    with Convolutions() as recorded:
        depthwise_over_tokens(conv, x).sum().backward()
    assert [name for name, _ in recorded.calls] == ["convolution"] * 2
    conv.requires_grad_(True)
    with Convolutions() as recorded:
        depthwise_over_tokens(conv, x.detach()).sum().backward()
    assert [name for name, _ in recorded.calls] == ["convolution"] + ["convolution_backward"] * -(-17 // TAPS)
