"""Depthwise convolution along the sequence (attention/depthwise.py) against the float64 loop reference:
output and the gradients of input, weight and bias, with kernels whose weight gradient comes in one, two and
three pieces on CPU."""

from __future__ import annotations

import pytest
import torch
from helpers.reference import depthwise_conv_loops

from convattn.attention import depthwise
from convattn.attention.depthwise import depthwise_over_tokens

TAPS = depthwise.WEIGHT_GRAD_TAPS


def output_and_grads(forward, x, conv, weights):
    out = forward(x)
    grads = torch.autograd.grad((out.double() * weights).sum(), [x, *conv.parameters()])
    return out.double(), [g.double() for g in grads]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kernel", [1, 3, TAPS, TAPS + 2, 17, 2 * TAPS + 3])
def test_outputs_and_all_gradients_match_loop_reference(kernel, bias, dtype):
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
