"""The fused Triton kernel's public entry (attn_implementation TRITON_IMPLEMENTATION; the CUDA default): attention with
relative terms in one kernel, forward and backward. The kernel is the package beside this module,
attention/relative/triton/ (its __init__ describes it): kernels.py the device code, launch.py the tilings and
launches, operator.py the operators and this entry."""

from __future__ import annotations

from convattn.attention.relative.triton.launch import autotuned_configs, kernel_dropout_p
from convattn.attention.relative.triton.operator import triton_relative_attention

__all__ = ["autotuned_configs", "kernel_dropout_p", "triton_relative_attention"]
