"""The fused kernel as one pair of torch operators, forward and backward, with one autograd registration: what
torch.compile, torch.export and any dispatch mode see; and, for eager calls, one torch.autograd.Function over the
same runners and the same gradient code. Its public entry is `triton_relative_attention`.

On a GPU the operators are torch.library.triton_op, whose kernels (launched through wrap_triton) torch.compile's
graphs hold as kernels, for inductor to launch. Under Triton's interpreter wrap_triton hands back the kernel itself,
which neither fake tensors nor the functional tracing behind torch.compile can run: there the same functions are
opaque torch.library.custom_op operators. Both have the fake implementations below.

An eager call takes the Function (`_EagerAttention`), which launches the kernels itself: through the operators,
torch.library's dispatch, argument filling and autograd wrapper were 118 of the 226 us of host work around a plain
forward + backward's launches, and on a GPU a small model's step waits on its host (`python
benchmarks/triton_host_cost.py`).

Dropout's seed is drawn per call from torch's generator of the operands' device (a CUDA tensor on a GPU: a CUDA
graph's replay draws a new one, and a recorded generator state draws the same), read by the kernels from memory,
and saved for the backward, which replays the mask.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from convattn.attention.core import is_tracing
from convattn.attention.relative.triton.launch import (
    direct_launches,
    interpreting,
    memory_order,
    projected_tables,
    run_backward,
    run_forward,
    run_tables,
    stats_shape,
    table_gradient,
)


def _operator(name: str):
    """torch.library.triton_op on a GPU, custom_op under the interpreter (the module's docstring)."""
    if interpreting():
        return torch.library.custom_op(name, mutates_args=())
    return torch.library.triton_op(name, mutates_args=())


@_operator("convattn::triton_relative_tables")
def relative_tables(q: Tensor, k: Tensor, fixed: Tensor | None, query_kernel: Tensor | None,
                    key_kernel: Tensor | None) -> tuple[Tensor, Tensor]:
    """(row table, key table) projected from q and k in one launch (launch.run_tables); no gradient of its own:
    the attention operators send the tables' share back to q, k and the terms' parameters."""
    return run_tables(q, k, fixed, query_kernel, key_kernel, table_scale(q))


@relative_tables.register_fake
def _(q, k, fixed, query_kernel, key_kernel):
    return projected_tables(q, k, query_kernel, key_kernel)


@_operator("convattn::triton_relative_attention")
def attention_forward(q: Tensor, k: Tensor, v: Tensor, row_table: Tensor | None, key_table: Tensor | None,
                      keep: Tensor | None, cu_seqlens: Tensor | None, seed: Tensor | None, max_seqlen: int,
                      reach: int, clip: bool, dropout_p: float, scale: float, alibi_slopes: Tensor | None = None,
                      fixed: Tensor | None = None, query_kernel: Tensor | None = None,
                      key_kernel: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(out, log2-sum-exp of every query row). fixed, query_kernel, key_kernel: the parameters a table was projected
    with (relative_tables), read by the backward alone."""
    return run_forward(q, k, v, row_table, key_table, keep, cu_seqlens, seed, max_seqlen, reach, clip, dropout_p,
                       scale, alibi_slopes)


@attention_forward.register_fake
def _(q, k, v, row_table, key_table, keep, cu_seqlens, seed, max_seqlen, reach, clip, dropout_p, scale,
      alibi_slopes=None, fixed=None, query_kernel=None, key_kernel=None):
    return torch.empty_like(q), q.new_empty(stats_shape(q, cu_seqlens is not None), dtype=torch.float32)


@_operator("convattn::triton_relative_attention_backward")
def attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                       row_table: Tensor | None, key_table: Tensor | None, keep: Tensor | None,
                       cu_seqlens: Tensor | None, seed: Tensor | None, max_seqlen: int, reach: int, clip: bool,
                       dropout_p: float, scale: float, alibi_slopes: Tensor | None = None,
                       query_kernel: Tensor | None = None,
                       key_kernel: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, d row table, d key table), a table's per (sequence, head, position): launch.run_backward. With
    query_kernel (key_kernel), dq (dk) holds the projected table's share."""
    return _backward(grad_out, q, k, v, out, lse, row_table, key_table, keep, cu_seqlens, seed, max_seqlen, reach,
                     clip, dropout_p, scale, alibi_slopes, query_kernel, key_kernel)


def _backward(*args: object) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """attention_backward's computation, the operator's and the eager Function's."""
    return run_backward(*args, table_scale(args[1]))


@attention_backward.register_fake
def _(grad_out, q, k, v, out, lse, row_table, key_table, keep, cu_seqlens, seed, max_seqlen, reach, clip,
      dropout_p, scale, alibi_slopes=None, query_kernel=None, key_kernel=None):
    varlen = cu_seqlens is not None
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), table_gradient(row_table, q, varlen),
            table_gradient(key_table, q, varlen))


def _setup_context(ctx, inputs, output):
    (q, k, v, row_table, key_table, keep, cu_seqlens, seed, *ctx.options, alibi_slopes, fixed, query_kernel,
     key_kernel) = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], row_table, key_table, keep, cu_seqlens, seed, alibi_slopes,
                          fixed, query_kernel, key_kernel)
    ctx.table_shapes = _shapes(row_table, key_table)
    # the log-sum-exp's gradient is never read: autograd need not fill one with zeros (a launch on a GPU)
    ctx.set_materialize_grads(False)


def _differentiate(ctx, grad_out, grad_lse, backward=None):
    """The operator's gradients (and the eager Function's: `backward`, the runner launching directly)."""
    if grad_out is None:  # only the log-sum-exp was used
        return (None,) * 17
    (q, k, v, out, lse, row_table, key_table, keep, cu_seqlens, seed, alibi_slopes, fixed, query_kernel,
     key_kernel) = ctx.saved_tensors
    dq, dk, dv, grad_row, grad_key = (backward or attention_backward)(grad_out, q, k, v, out, lse, row_table,
                                                                      key_table, keep, cu_seqlens, seed, *ctx.options,
                                                                      alibi_slopes, query_kernel, key_kernel)
    # a projected table's share of dq and dk is in them already; what is left is its parameters' gradients
    grad_row, grad_fixed, grad_query_kernel = _projected(grad_row, q, fixed, query_kernel)
    grad_key, _, grad_key_kernel = _projected(grad_key, k, None, key_kernel)
    grad_row, grad_key = (None if grad is None else _as_table(grad, shape)
                          for grad, shape in zip((grad_row, grad_key), ctx.table_shapes, strict=True))
    # ALiBi's slopes are constants: no gradient
    return (dq, dk, dv, grad_row, grad_key, None, None, None, None, None, None, None, None, None, grad_fixed,
            grad_query_kernel, grad_key_kernel)


def table_scale(x: Tensor) -> float:
    """What a projected table's product is scaled by: 1 / sqrt(d), d x's channels a head (bias.py's terms)."""
    return x.shape[-1] ** -0.5


def _projected(grad_table: Tensor, x: Tensor, fixed: Tensor | None,
               kernel: Tensor | None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(the table's own gradient, fixed's, the kernel's) for a table T = fixed + x W / sqrt(d): a projected
    table (kernel given) sends all of its gradient to its parameters, summed over every (sequence, head, position)
    of x; a table given as it is keeps it."""
    if kernel is None:
        return grad_table, None, None
    grad_fixed = None
    if fixed is not None:  # (heads, 2r + 1): the heads are axis 1, padded (b, h, n, .) and packed (total, h, .)
        summed = [axis for axis in range(grad_table.dim() - 1) if axis != 1]
        grad_fixed = grad_table.sum(summed, dtype=torch.float32).to(fixed.dtype)
    # x and the gradient laid out alike (launch.table_like): two matrices of rows without a copy
    order = memory_order(x)
    rows, grad_rows = (t.permute(*order, -1).reshape(-1, t.shape[-1]) for t in (x, grad_table))
    grad_kernel = (rows.mT @ grad_rows).to(kernel.dtype) * table_scale(x)
    return None, grad_fixed, grad_kernel


attention_forward.register_autograd(_differentiate, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """attention_forward and its gradient for eager calls: the same runners, context and gradient code, without
    torch.library's dispatch (the module's docstring); the kernels launched as they are (launch.direct_launches)."""

    # ctx in forward, not a setup_context of its own: Function.apply binds a separate one's arguments through
    # inspect.signature at every call, 8 us of each layer's host work (torch.func's transforms, which would need
    # one, do not run the kernel: it reads data pointers)
    @staticmethod
    def forward(ctx, *inputs):
        with direct_launches():
            output = run_forward(*inputs[:14])
        _setup_context(ctx, inputs, output)
        ctx.mark_non_differentiable(output[1])
        return output

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return _differentiate(ctx, grad_out, grad_lse, backward=_direct_backward)


def _direct_backward(*args):
    with direct_launches():
        return _backward(*args)


def _eager(q: Tensor) -> bool:
    """Whether a call takes _EagerAttention: plain tensors, nothing tracing or intercepting torch's operators (the
    operators are what torch.compile, torch.export, fake tensors and dispatch modes handle)."""
    return type(q) is Tensor and not is_tracing() and _get_current_dispatch_mode() is None


def _shapes(*tables: Tensor | None) -> list:
    return [None if t is None else (t.shape, t.dtype) for t in tables]


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
                              scale: float | None = None, alibi_slopes: Tensor | None = None,
                              fixed: Tensor | None = None, query_kernel: Tensor | None = None,
                              key_kernel: Tensor | None = None) -> Tensor:
    """softmax(q k^T * scale + relative terms [+ ALiBi] [+ pad keys masked]) with dropout, times v, in one fused
    kernel.

    Padded: q, k, v (batch, heads, n, d), row_table (batch or 1, heads, n, 2r + 1) at [i, c(j - i)], key_table
    (batch, heads, n, 2r + 1) at [j, c(i - j)], keep (batch, n) bool. Packed: q, k, v (total, heads, d), tables
    (total, heads, 2r + 1), cu_seqlens (batch + 1,) int32 offsets of the sequences and max_seqlen their longest
    length. Either table may be None. scale defaults to 1 / sqrt(d). alibi_slopes (heads,): ALiBi's -m_h |i - j|
    added to every score, m_h the head's slope, i and j the positions within the sequence, computed inside the
    kernel (no table); held in float32. Gradients flow to q, k, v and both tables. Dropout drops at
    kernel_dropout_p(dropout_p), the nearest multiple of 1/256.

    Instead of a table, the terms' parameters (bias.py): query_kernel W (d, 2r + 1) with fixed (heads, 2r + 1) or
    None, for the row table fixed + q W / sqrt(d); key_kernel U (d, 2r + 1), for the key table k U / sqrt(d)
    (bias.py's terms, d the channels of a head). Those tables are then projected inside the kernels' launches
    (one for both), and the backward kernels send their share of the gradient back to q and k themselves: a
    dozen of torch's launches fewer per call than building the tables outside. Gradients flow to the parameters.
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
    projections = _check_projections(q, row_table, key_table, fixed, query_kernel, key_kernel, reach)
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
    eager = _eager(q)
    if projections:
        fixed, query_kernel, key_kernel = (None if t is None else t.contiguous()
                                           for t in (fixed, query_kernel, key_kernel))
        # computed, not differentiated: the attention's backward differentiates them
        operands = (q.detach(), k.detach(), *(None if t is None else t.detach()
                                               for t in (fixed, query_kernel, key_kernel)))
        if eager:
            with direct_launches():
                built_row, built_key = run_tables(*operands, table_scale(q))
        else:
            built_row, built_key = relative_tables(*operands)
        row_table = built_row if query_kernel is not None else row_table
        key_table = built_key if key_kernel is not None else key_table
    seed = torch.randint(0, 2**30, (), device=q.device) if dropout_p > 0 else None
    inputs = (q, k, v, row_table, key_table, keep, cu_seqlens, seed, max_seqlen or 0, reach, clip, dropout_p,
              q.shape[-1] ** -0.5 if scale is None else scale, alibi_slopes, fixed, query_kernel, key_kernel)
    return (_EagerAttention.apply(*inputs) if eager else attention_forward(*inputs))[0]


def _check_projections(q: Tensor, row_table: Tensor | None, key_table: Tensor | None, fixed: Tensor | None,
                       query_kernel: Tensor | None, key_kernel: Tensor | None, reach: int) -> bool:
    """Whether a table is projected inside the kernels; one line naming the argument that cannot be taken."""
    if fixed is not None and query_kernel is None:
        raise ValueError("fixed is projected with query_kernel only: without one, pass the fixed terms as row_table "
                         "(fixed[None, :, None, :] expanded over the positions)")
    for name, table, kernel in (("row_table", row_table, query_kernel), ("key_table", key_table, key_kernel)):
        if table is not None and kernel is not None:
            raise ValueError(f"{name} and the kernel that projects it are exclusive: pass one of them")
    width, heads, head_dim = 2 * reach + 1, q.shape[1], q.shape[-1]
    for name, tensor, shape in (("query_kernel", query_kernel, (head_dim, width)),
                                ("key_kernel", key_kernel, (head_dim, width)), ("fixed", fixed, (heads, width))):
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must be {shape} (heads {heads}, head size {head_dim}, reach {reach}); got "
                             f"{tuple(tensor.shape)}")
    return query_kernel is not None or key_kernel is not None
