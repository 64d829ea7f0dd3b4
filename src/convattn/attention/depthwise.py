"""Depthwise convolution along the sequence of (batch, n, channels) tensors: composite attention's value and
projection convolutions and ConvBERT's span convolution. Parameters stay those of a depthwise nn.Conv1d
(groups = channels, odd kernel, 'same' zero padding); only how the product is computed differs by device."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from convattn.attention.core import is_tracing

# On CPU, PyTorch's depthwise kernels for a channels-last 1 x K conv2d (what a (batch, n, channels) tensor is
# without a copy) take 0.4-0.6 ms forward where Conv1d of the transposed tensor takes ~9 ms (batch 16, n 512,
# 256 channels, 2 threads). Backward to the input is the same kind of convolution (the kernel flipped, 0.5-0.8
# ms). Backward to the weight is fast there only for narrow kernels: 5 ms at K = 9 and 8 ms at 11, but 56-62
# ms at 15 and 17 (Conv1d's, of contiguous copies: 23-28 ms). So the weight gradient comes in pieces of at most
# this many taps, each the gradient of a narrower convolution of the padded input: K = 17 as 9 + 8 taps, 8.5 ms.
WEIGHT_GRAD_TAPS = 9


def _conv_tokens(x: Tensor, weight: Tensor, bias: Tensor | None, padding: int) -> Tensor:
    """The depthwise conv2d of the channels-last view: (batch, n, C) -> (batch, n', C)."""
    out = F.conv2d(x.transpose(1, 2).unsqueeze(2), weight.unsqueeze(2), bias, padding=(0, padding),
                   groups=weight.shape[0])
    return out.squeeze(2).transpose(1, 2)


def _weight_grad(x: Tensor, grad: Tensor, weight: Tensor) -> Tensor:
    """The weight gradient (C, 1, K) of the 'same' depthwise convolution that gave output gradient `grad` from
    input x (both (batch, n, C)): tap t correlates grad with x shifted by t - K//2, a piece of taps at a time."""
    n, channels, width = x.shape[1], x.shape[2], weight.shape[-1]
    padded = F.pad(x, (0, 0, width // 2, width // 2))
    grad_view = grad.transpose(1, 2).unsqueeze(2)
    pieces = []
    for first in range(0, width, WEIGHT_GRAD_TAPS):
        taps = min(WEIGHT_GRAD_TAPS, width - first)
        inputs = padded[:, first:first + n + taps - 1].transpose(1, 2).unsqueeze(2)
        piece = weight[..., first:first + taps].unsqueeze(2)
        pieces.append(torch.ops.aten.convolution_backward(
            grad_view, inputs, piece, None, [1, 1], [0, 0], [1, 1], False, [0, 0], channels, [False, True, False])[1])
    return torch.cat(pieces, -1).squeeze(2)


class _CpuDepthwise(torch.autograd.Function):
    """Forward and both gradients as channels-last conv2d (module comment)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        return _conv_tokens(x, weight, bias, weight.shape[-1] // 2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        width = weight.shape[-1]
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _conv_tokens(grad, weight.flip(-1), None, width // 2)
        if ctx.needs_input_grad[1]:
            grad_weight = _weight_grad(x, grad, weight)
        if ctx.needs_input_grad[2]:
            grad_bias = grad.sum((0, 1))
        return grad_x, grad_weight, grad_bias


def depthwise_over_tokens(conv: nn.Conv1d, x: Tensor) -> Tensor:
    """conv (a depthwise nn.Conv1d with 'same' padding) along the sequence of x (batch, n, channels). Traced graphs
    (torch.compile, export, ONNX) keep the plain Conv1d, which every backend lowers its own way."""
    if x.device.type == "cpu" and not is_tracing():
        return _CpuDepthwise.apply(x, conv.weight, conv.bias)
    return conv(x.transpose(1, 2)).transpose(1, 2)
