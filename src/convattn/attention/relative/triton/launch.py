"""Tilings and launches of the fused kernel (kernels.py): the operands' shapes and strides, the tilings the autotuner
tries, the grids, and one function per direction that allocates the outputs and launches the kernels."""

from __future__ import annotations

import os
from functools import cache

import torch
import triton
from torch import Tensor

from convattn.attention.relative.triton import kernels


def interpreting() -> bool:
    """Whether triton runs kernels on the CPU (TRITON_INTERPRET=1, read when triton.jit defines a kernel)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernel_dropout_p(p: float) -> float:
    """The rate the kernels drop probabilities at: p to the nearest multiple of 1/256, at least 1/256 where p > 0
    (dropout_keep compares a byte per score, as the flash kernel behind SDPA does with its 1/255)."""
    return 0.0 if p == 0 else min(max(round(p * 256), 1), 255) / 256


# ---------------------------------------------------------------------------------------------------------------------
# tilings


def configs(kernel: str, head_dim: int, dtype: torch.dtype) -> list[tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for the autotuner to try per kernel ("forward", "query", "key");
    the first alone when interpreting. Half precision with heads of up to 64 channels: the fastest three of ten
    tilings per kernel, timed on an H200 (benchmarks/triton_tuning.py; results/gpu_session/session2/tuning.md) at
    n = 512, 2,048 and 8,192, without terms and with both tables, padding and dropout. float32 and wider heads: from
    ptxas's register report for sm_90 (benchmarks/triton_resources.py), untimed."""
    if interpreting():
        return [(16, 32, 1, 1)]  # the smallest tiles dropout_keep allows
    if dtype == torch.float32 or head_dim > 64:
        return [(64, 32, 4, 2), (32, 64, 4, 2)]
    return {"forward": [(128, 64, 8, 3), (128, 32, 4, 3), (128, 64, 4, 3)],
            "query": [(64, 32, 4, 3), (64, 64, 4, 3), (128, 32, 4, 3)],
            "key": [(64, 64, 4, 3), (32, 64, 4, 3), (16, 128, 4, 3)]}[kernel]


KERNELS = {"forward": kernels.forward_kernel, "query": kernels.query_gradient_kernel,
           "key": kernels.key_gradient_kernel}

# the autotuners made so far, by (kernel, head size, dtype): what they chose is in their caches
AUTOTUNERS: dict[tuple[str, int, torch.dtype], triton.runtime.Autotuner] = {}

# what the autotuner keys a tiling on, beside the length bucket
TUNING_KEY = ("REACH", "CLIP", "HAS_ROW", "HAS_KEY", "HAS_KEEP", "VARLEN", "DROPOUT")


def specialization(args: tuple) -> tuple:
    """What Triton's JIT compiles a launch's runtime arguments for, argument by argument, at a fraction of its
    binder's cost: a tensor's dtype and 16-byte alignment; an integer's being 1, a multiple of 16 and within 32
    bits (for every integer, those the kernels exempt from specialization too: finer than the JIT, never
    coarser); a float's type."""
    return tuple((arg.dtype, arg.data_ptr() % 16 == 0) if isinstance(arg, Tensor)
                 else (arg == 1, arg % 16 == 0, -2**31 <= arg < 2**31) if isinstance(arg, int)
                 else type(arg) for arg in args)


@cache
def launcher(kernel: str, head_dim: int, dtype: torch.dtype):
    """launch(grid, *args, length_bucket=.., **constexprs): the jitted kernel, autotuned over `configs` on a GPU
    (keyed by the length bucket and TUNING_KEY). The autotuner times the tilings at a key's first call; the JIT
    compiles the pick at the first call of each specialization (`specialization`); every later call launches that
    binary directly, without the JIT's per-call work on the host (its binder, cache key and launch hooks: about
    half of a launch's host time with our kernels' 40-odd arguments; results/gpu_session/session2/tuning.md)."""
    function = KERNELS[kernel]
    tilings = configs(kernel, head_dim, dtype)
    if any(m % 16 or n % 32 for m, n, _, _ in tilings):
        raise ValueError(f"BLOCK_M must be a multiple of 16 and BLOCK_N of 32 (dropout_keep's query pairs and key "
                         f"chunks); got {tilings}")
    options = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in tilings]
    if interpreting():
        config = options[0]
        return lambda grid, *args, **kwargs: function[grid](*args, **config.all_kwargs(), **kwargs)
    tuned = AUTOTUNERS[kernel, head_dim, dtype] = triton.autotune(configs=options,
                                                                   key=["length_bucket", *TUNING_KEY])(function)
    picked: dict[tuple, dict] = {}
    binaries: dict[tuple, triton.compiler.CompiledKernel] = {}

    def launch(grid, *args, length_bucket: int, **constants):
        key = (length_bucket, *(constants[name] for name in TUNING_KEY))
        config = picked.get(key)
        if config is None:
            tuned[grid](*args, length_bucket=length_bucket, **constants)
            picked[key] = tuned.best_config.all_kwargs()
            return
        device = triton.runtime.driver.active.get_current_device()
        exact = (device, key, specialization(args))
        binary = binaries.get(exact)
        if binary is None or triton.knobs.runtime.launch_enter_hook is not None:  # compile, or let a profiler see
            binaries[exact] = function[grid](*args, length_bucket=length_bucket, **constants, **config)
            return
        blocks = grid(config)
        binary.run(blocks[0], blocks[1], 1, triton.runtime.driver.active.get_current_stream(device), binary.function,
                   binary.packed_metadata, None, None, None,
                   *launch_arguments(function, args, {"length_bucket": length_bucket, **constants, **config}))
    return launch


def launch_arguments(function: triton.JITFunction, args: tuple, keywords: dict) -> list:
    """Every parameter of the kernel in its order, constexprs included, as the JIT hands them to a binary's
    launcher: the runtime arguments, then the keywords by name (the config's options, which are no parameters,
    left out)."""
    return [*args, *(keywords[name] for name in function.arg_names[len(args):])]


def autotuned_configs() -> list[str]:
    """One line per tiling the autotuner chose so far: the kernel, head size, dtype, its key and the config."""
    return [f"{kernel} d={head_dim} {str(dtype).removeprefix('torch.')} {key}: {config}"
            for (kernel, head_dim, dtype), tuner in AUTOTUNERS.items() for key, config in tuner.cache.items()]


# ---------------------------------------------------------------------------------------------------------------------
# operands


def strides(x: Tensor | None, varlen: bool) -> tuple[int, int, int]:
    """(batch, head, position) strides of a padded (b, h, n, c) or packed (total, h, c) operand; 0 where absent or
    broadcast."""
    if x is None:
        return 0, 0, 0
    if varlen:
        return 0, x.stride(1), x.stride(0)
    return (0 if x.shape[0] == 1 else x.stride(0)), x.stride(1), x.stride(2)


def stats_shape(q: Tensor, varlen: bool) -> tuple[int, ...]:
    """The log-sum-exp's and D's shape: (heads, total) packed, (batch, heads, n) padded."""
    return (q.shape[1], q.shape[0]) if varlen else tuple(q.shape[:3])


def table_gradient(table: Tensor | None, q: Tensor, varlen: bool) -> Tensor:
    """One row per (sequence, head, position), written whole by the kernels (zero_unpartnered): in the table's
    dtype, or float32 where the table is broadcast over the batch (the operator sums it). An empty tensor for an
    absent table (an operator returns no None)."""
    if table is None:
        return q.new_empty(0, dtype=torch.float32)
    if varlen or table.shape[0] == q.shape[0]:
        return torch.empty(table.shape, dtype=table.dtype, device=q.device)
    return q.new_empty((q.shape[0], *table.shape[1:]), dtype=torch.float32)


class Problem:
    """Shapes, strides and constexprs shared by the kernels of one call."""

    def __init__(self, q: Tensor, row_table: Tensor | None, key_table: Tensor | None, keep: Tensor | None,
                 cu_seqlens: Tensor | None, max_seqlen: int, reach: int, clip: bool, dropout_p: float, scale: float,
                 seed: int):
        self.varlen = cu_seqlens is not None
        self.stats_shape = stats_shape(q, self.varlen)
        if self.varlen:
            total, self.heads, self.head_dim = q.shape
            self.batch, self.seqlen = cu_seqlens.numel() - 1, max_seqlen
            self.stats_strides = (0, total)
        else:
            self.batch, self.heads, self.seqlen, self.head_dim = q.shape
            self.stats_strides = (self.heads * self.seqlen, self.seqlen)
        self.row_table, self.key_table, self.keep, self.cu_seqlens = row_table, key_table, keep, cu_seqlens
        self.scale, self.dropout_p, self.seed = scale, kernel_dropout_p(dropout_p), seed
        self.constants = dict(REACH=reach, CLIP=clip, HAS_ROW=row_table is not None, HAS_KEY=key_table is not None,
                              HAS_KEEP=keep is not None, VARLEN=self.varlen, DROPOUT=dropout_p > 0,
                              HEAD_DIM=self.head_dim, BLOCK_D=max(16, 1 << (self.head_dim - 1).bit_length()),
                              PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
        self.length_bucket = 1 << max(self.seqlen - 1, 0).bit_length()

    def operands(self, q: Tensor) -> list:
        """The pointers every kernel takes after q, k, v: tables, key mask, sequence offsets (q where absent)."""
        return [q if t is None else t for t in (self.row_table, self.key_table, self.keep, self.cu_seqlens)]

    def scalars(self) -> list:
        """seed, p_drop, scale, seqlen, rng_stride (dropout's Philox counters per query pair: four per 32 keys) and
        heads."""
        return [self.seed, self.dropout_p, self.scale, self.seqlen, 4 * -(-self.seqlen // 32), self.heads]

    def keywords(self) -> dict:
        """The constexprs, and length_bucket: the next power of two of the length, which the kernels ignore and the
        autotuner keys on (one tuning per bucket, not per length)."""
        return dict(length_bucket=self.length_bucket, **self.constants)

    def table_strides(self) -> list[int]:
        keep_stride = self.keep.stride(0) if self.keep is not None else 0
        return [*strides(self.row_table, self.varlen), *strides(self.key_table, self.varlen), keep_stride,
                *self.stats_strides]

    def forward_arguments(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor) -> list:
        """The forward kernel's runtime arguments, before length_bucket and the constexprs (`keywords`)."""
        return [q, k, v, *self.operands(q), out, lse, *self.scalars(), *strides(q, self.varlen),
                *strides(k, self.varlen), *strides(v, self.varlen), *strides(out, self.varlen),
                *self.table_strides()]

    def query_arguments(self, q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, out: Tensor, lse: Tensor,
                        delta: Tensor, grad_q: Tensor, grad_row: Tensor | None) -> list:
        """The query-gradient kernel's runtime arguments (grad_row None without a row table); dO and O have q's
        strides."""
        return [q, k, v, *self.operands(q), grad_out, out, lse, delta, grad_q, q if grad_row is None else grad_row,
                *self.scalars(), *self._gradient_strides(q, k, v), *strides(grad_row, self.varlen)]

    def key_arguments(self, q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, lse: Tensor, delta: Tensor,
                      grad_k: Tensor, grad_v: Tensor, grad_key: Tensor | None) -> list:
        """The key-gradient kernel's runtime arguments (grad_key None without a key table)."""
        return [q, k, v, *self.operands(q), grad_out, lse, delta, grad_k, grad_v,
                q if grad_key is None else grad_key, *self.scalars(), *self._gradient_strides(q, k, v),
                *strides(grad_key, self.varlen)]

    def _gradient_strides(self, q: Tensor, k: Tensor, v: Tensor) -> list[int]:
        return [*strides(q, self.varlen), *strides(k, self.varlen), *strides(v, self.varlen),
                *self.table_strides()]

    def grid(self, along: str):
        return lambda meta: (-(-self.seqlen // meta[along]), self.batch * self.heads)


# ---------------------------------------------------------------------------------------------------------------------
# launches


def run_forward(q: Tensor, k: Tensor, v: Tensor, row_table: Tensor | None, key_table: Tensor | None,
                keep: Tensor | None, cu_seqlens: Tensor | None, seed: int, max_seqlen: int, reach: int, clip: bool,
                dropout_p: float, scale: float) -> tuple[Tensor, Tensor]:
    """(out, log2-sum-exp of every query row in float32)."""
    problem = Problem(q, row_table, key_table, keep, cu_seqlens, max_seqlen, reach, clip, dropout_p, scale, seed)
    out = torch.empty_like(q)
    lse = torch.empty(problem.stats_shape, dtype=torch.float32, device=q.device)
    launch = launcher("forward", problem.head_dim, q.dtype)
    launch(problem.grid("BLOCK_M"), *problem.forward_arguments(q, k, v, out, lse), **problem.keywords())
    return out, lse


def run_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                 row_table: Tensor | None, key_table: Tensor | None, keep: Tensor | None, cu_seqlens: Tensor | None,
                 seed: int, max_seqlen: int, reach: int, clip: bool, dropout_p: float,
                 scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, d row table, d key table), the tables' in float32 per (sequence, head, position)."""
    problem = Problem(q, row_table, key_table, keep, cu_seqlens, max_seqlen, reach, clip, dropout_p, scale, seed)
    # the query kernel reads dO and O with q's strides
    grad_out, out = (x if x.stride() == q.stride() else torch.empty_like(q).copy_(x) for x in (grad_out, out))
    delta = torch.empty(problem.stats_shape, dtype=torch.float32, device=q.device)  # the query kernel fills it
    grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grad_row, grad_key = (table_gradient(table, q, problem.varlen) for table in (row_table, key_table))
    launcher("query", problem.head_dim, q.dtype)(
        problem.grid("BLOCK_M"), *problem.query_arguments(q, k, v, grad_out, out, lse, delta, grad_q,
                                                          grad_row if row_table is not None else None),
        **problem.keywords())
    launcher("key", problem.head_dim, q.dtype)(
        problem.grid("BLOCK_N"), *problem.key_arguments(q, k, v, grad_out, lse, delta, grad_k, grad_v,
                                                        grad_key if key_table is not None else None),
        **problem.keywords())
    return grad_q, grad_k, grad_v, grad_row, grad_key
