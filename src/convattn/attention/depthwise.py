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
# ms at 15 and 17, where Conv1d's weight gradient of contiguous (batch, channels, n) copies takes 23 ms.
CHANNELS_LAST_WEIGHT_GRAD_MAX_KERNEL = 11


def _conv_tokens(x: Tensor, weight: Tensor, bias: Tensor | None, padding: int) -> Tensor:
    """The depthwise conv2d of the channels-last view: (batch, n, C) -> (batch, n', C)."""
    out = F.conv2d(x.transpose(1, 2).unsqueeze(2), weight.unsqueeze(2), bias, padding=(0, padding),
                   groups=weight.shape[0])
    return out.squeeze(2).transpose(1, 2)


class _CpuDepthwise(torch.autograd.Function):
    """Forward and the input gradient as channels-last conv2d; the weight gradient channels-last for narrow
    kernels, from contiguous Conv1d layouts for wide ones."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _conv_tokens(x, weight, bias, weight.shape[-1] // 2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        channels, width = weight.shape[0], weight.shape[-1]
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _conv_tokens(grad, weight.flip(-1), None, width // 2)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            mask = [False, ctx.needs_input_grad[1], ctx.needs_input_grad[2]]
            bias_sizes = [channels] if ctx.has_bias else None
            if width <= CHANNELS_LAST_WEIGHT_GRAD_MAX_KERNEL:
                grads = torch.ops.aten.convolution_backward(
                    grad.transpose(1, 2).unsqueeze(2), x.transpose(1, 2).unsqueeze(2), weight.unsqueeze(2),
                    bias_sizes, [1, 1], [0, width // 2], [1, 1], False, [0, 0], channels, mask)
                grad_weight = grads[1].squeeze(2) if grads[1] is not None else None
            else:
                grads = torch.ops.aten.convolution_backward(
                    grad.transpose(1, 2).contiguous(), x.transpose(1, 2).contiguous(), weight, bias_sizes, [1],
                    [width // 2], [1], False, [0], channels, mask)
                grad_weight = grads[1]
            grad_bias = grads[2]
        return grad_x, grad_weight, grad_bias


def depthwise_over_tokens(conv: nn.Conv1d, x: Tensor) -> Tensor:
    """conv (a depthwise nn.Conv1d with 'same' padding) along the sequence of x (batch, n, channels). Traced graphs
    (torch.compile, export, ONNX) keep the plain Conv1d, which every backend lowers its own way."""
    if x.device.type == "cpu" and not is_tracing():
        return _CpuDepthwise.apply(x, conv.weight, conv.bias)
    return conv(x.transpose(1, 2)).transpose(1, 2)
