"""The fused kernel as one pair of torch operators, forward and backward, with one autograd registration: what eager
code calls and what torch.compile sees. Its public entry is `triton_relative_attention`.

On a GPU the operators are torch.library.triton_op, whose kernels (launched through wrap_triton) torch.compile's
graphs hold as kernels, for inductor to launch. Under Triton's interpreter wrap_triton hands back the kernel itself,
which neither fake tensors nor the functional tracing behind torch.compile can run: there the same functions are
opaque torch.library.custom_op operators. Both have the fake implementations below.

Dropout's seed is drawn per call from torch's generator of the operands' device (a CUDA tensor on a GPU: a CUDA
graph's replay draws a new one, and a recorded generator state draws the same), read by the kernels from memory,
and saved for the backward, which replays the mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from convattn.attention.relative.triton.launch import (
    interpreting,
    run_backward,
    run_forward,
    stats_shape,
    table_gradient,
)


def _operator(name: str):
    """torch.library.triton_op on a GPU, custom_op under the interpreter (the module's docstring)."""
    if interpreting():
        return torch.library.custom_op(name, mutates_args=())
    return torch.library.triton_op(name, mutates_args=())


@_operator("convattn::triton_relative_attention")
def attention_forward(q: Tensor, k: Tensor, v: Tensor, row_table: Tensor | None, key_table: Tensor | None,
                      keep: Tensor | None, cu_seqlens: Tensor | None, seed: Tensor | None, max_seqlen: int,
                      reach: int, clip: bool, dropout_p: float, scale: float,
                      alibi_slopes: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(out, log2-sum-exp of every query row)."""
    return run_forward(q, k, v, row_table, key_table, keep, cu_seqlens, seed, max_seqlen, reach, clip, dropout_p,
                       scale, alibi_slopes)


@attention_forward.register_fake
def _(q, k, v, row_table, key_table, keep, cu_seqlens, seed, max_seqlen, reach, clip, dropout_p, scale,
      alibi_slopes=None):
    return torch.empty_like(q), q.new_empty(stats_shape(q, cu_seqlens is not None), dtype=torch.float32)


@_operator("convattn::triton_relative_attention_backward")
def attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                       row_table: Tensor | None, key_table: Tensor | None, keep: Tensor | None,
                       cu_seqlens: Tensor | None, seed: Tensor | None, max_seqlen: int, reach: int, clip: bool,
                       dropout_p: float, scale: float,
                       alibi_slopes: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, d row table, d key table), a table's per (sequence, head, position): launch.run_backward."""
    return run_backward(grad_out, q, k, v, out, lse, row_table, key_table, keep, cu_seqlens, seed, max_seqlen,
                        reach, clip, dropout_p, scale, alibi_slopes)


@attention_backward.register_fake
def _(grad_out, q, k, v, out, lse, row_table, key_table, keep, cu_seqlens, seed, max_seqlen, reach, clip,
      dropout_p, scale, alibi_slopes=None):
    varlen = cu_seqlens is not None
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), table_gradient(row_table, q, varlen),
            table_gradient(key_table, q, varlen))


def _setup_context(ctx, inputs, output):
    q, k, v, row_table, key_table, keep, cu_seqlens, seed, *ctx.options, alibi_slopes = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], row_table, key_table, keep, cu_seqlens, seed, alibi_slopes)
    ctx.table_shapes = _shapes(row_table, key_table)
    # the log-sum-exp's gradient is never read: autograd need not fill one with zeros (a launch on a GPU)
    ctx.set_materialize_grads(False)


def _differentiate(ctx, grad_out, grad_lse):
    if grad_out is None:  # only the log-sum-exp was used
        return (None,) * 14
    q, k, v, out, lse, row_table, key_table, keep, cu_seqlens, seed, alibi_slopes = ctx.saved_tensors
    grads = attention_backward(grad_out, q, k, v, out, lse, row_table, key_table, keep, cu_seqlens, seed,
                               *ctx.options, alibi_slopes)
    # ALiBi's slopes are constants: no gradient
    return *_as_inputs(grads, ctx.table_shapes), None, None, None, None, None, None, None, None, None


attention_forward.register_autograd(_differentiate, setup_context=_setup_context)


def _shapes(*tables: Tensor | None) -> list:
    return [None if t is None else (t.shape, t.dtype) for t in tables]


def _as_inputs(grads: tuple[Tensor, ...], table_shapes: list) -> tuple:
    """dq, dk, dv and each table's gradient in its own shape and dtype (summed over the batch a broadcast table was
    shared by; None for an absent table)."""
    *grad_qkv, grad_row, grad_key = grads
    return *grad_qkv, *(_as_table(grad, shape) for grad, shape in zip((grad_row, grad_key), table_shapes,
                                                                        strict=True))


def _as_table(grad: Tensor, shape_and_dtype) -> Tensor | None:
    if shape_and_dtype is None:
        return None
    shape, dtype = shape_and_dtype
    if grad.shape != shape:
        grad = grad.sum(0, keepdim=True)
    return grad.to(dtype)


def triton_relative_attention(q: Tensor, k: Tensor, v: Tensor, row_table: Tensor | None, key_table: Tensor | None,
                              *, reach: int, clip: bool, keep: Tensor | None = None, dropout_p: float = 0.0,
                              cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                              scale: float | None = None, alibi_slopes: Tensor | None = None) -> Tensor:
    """softmax(q k^T * scale + relative terms [+ ALiBi] [+ pad keys masked]) with dropout, times v, in one fused
    kernel.

    Padded: q, k, v (batch, heads, n, d), row_table (batch or 1, heads, n, 2r + 1) at [i, c(j - i)], key_table
    (batch, heads, n, 2r + 1) at [j, c(i - j)], keep (batch, n) bool. Packed: q, k, v (total, heads, d), tables
    (total, heads, 2r + 1), cu_seqlens (batch + 1,) int32 offsets of the sequences and max_seqlen their longest
    length. Either table may be None. scale defaults to 1 / sqrt(d). alibi_slopes (heads,): ALiBi's -m_h |i - j|
    added to every score, m_h the head's slope, i and j the positions within the sequence, computed inside the
    kernel (no table); held in float32. Gradients flow to q, k, v and both tables. Dropout drops at
    kernel_dropout_p(dropout_p), the nearest multiple of 1/256.
    """
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q.dtype must be float16, bfloat16 or float32 for the Triton kernel; got {q.dtype}")
    if q.device.type != ("cpu" if interpreting() else "cuda"):
        raise RuntimeError(f"the Triton kernel runs on CUDA, or on CPU under TRITON_INTERPRET=1; got {q.device}")
    if cu_seqlens is not None and keep is not None:
        raise ValueError("keep and cu_seqlens are exclusive: packed sequences have no padding")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p}")
    if scale == 0:  # the band's terms enter the product divided by it (score_tile)
        raise ValueError("scale must be nonzero (None for 1 / sqrt(d)); got 0")
    if alibi_slopes is not None:
        if alibi_slopes.shape != (q.shape[1],):
            raise ValueError(f"alibi_slopes must hold one slope per head, shape ({q.shape[1]},); got "
                             f"{tuple(alibi_slopes.shape)}")
        alibi_slopes = alibi_slopes.to(device=q.device, dtype=torch.float32).contiguous()
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(torch.int32)
        max_seqlen = int(max_seqlen if max_seqlen is not None else (cu_seqlens[1:] - cu_seqlens[:-1]).max())
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    row_table, key_table = (t if t is None or t.stride(-1) == 1 else t.contiguous() for t in (row_table, key_table))
    if keep is not None:
        # a bitcast is free in eager; under torch.compile a conversion, as Inductor (torch 2.11) cannot lower a bool
        # bitcast: the CUDA-graph tests failed on it in the 2026-11-30 GPU call
        bitcast = keep.dtype == torch.bool and not torch.compiler.is_compiling()
        keep = keep.view(torch.uint8) if bitcast else keep.to(torch.uint8)
    seed = torch.randint(0, 2**30, (), device=q.device) if dropout_p > 0 else None
    return attention_forward(q, k, v, row_table, key_table, keep, cu_seqlens, seed, max_seqlen or 0, reach, clip,
                             dropout_p, q.shape[-1] ** -0.5 if scale is None else scale, alibi_slopes)[0]
