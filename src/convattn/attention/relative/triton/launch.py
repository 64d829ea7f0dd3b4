"""Tilings and launches of the fused kernel (kernels.py): the operands' shapes and strides, the tilings the autotuner
tries, the grids, and one function per direction that allocates the outputs and launches the kernels."""

from __future__ import annotations

import math
import os
import threading
from contextlib import contextmanager
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
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for the autotuner to try per kernel ("forward", "backward"); the
    first alone when interpreting. Half precision, heads of up to 64 channels: the forward's fastest three of ten
    tilings timed on an H200 (python benchmarks/triton_tuning.py); the backward's four with the fewest instructions
    per score among those whose loops spill least, read from ptxas for sm_90 without a GPU (python
    benchmarks/triton_resources.py), one-stage since that count cannot credit the latency pipelining hides. Float32
    or 128 channels: the tilings that spill least there. Every backward key block is 64 wide, so `splits` deals the
    same blocks whichever the autotuner picks."""
    if interpreting():
        return [(16, 32, 1, 1)]  # the smallest tiles dropout_keep allows
    if dtype == torch.float32 or head_dim > 64:
        return {"forward": [(64, 32, 4, 2), (32, 64, 4, 2)], "backward": [(32, 64, 8, 1), (32, 64, 4, 1)]}[kernel]
    return {"forward": [(128, 64, 8, 3), (128, 32, 4, 3), (128, 64, 4, 3)],
            "backward": [(64, 64, 4, 1), (128, 64, 8, 1), (32, 64, 4, 1), (32, 64, 8, 1)]}[kernel]


# the autotuned kernels; backward_preprocess and query_gradient_kernel, which stream rows, run at ROWS rows and 4 warps
KERNELS = {"forward": kernels.forward_kernel, "backward": kernels.backward_kernel}
ROWS = 64

# the autotuners made so far, by (kernel, head size, dtype): what they chose is in their caches
AUTOTUNERS: dict[tuple[str, int, torch.dtype], triton.runtime.Autotuner] = {}

# what the autotuner keys a tiling on, beside the length bucket (and the backward's dQ design)
TUNING_KEY = ("REACH", "CLIP", "HAS_ROW", "HAS_KEY", "HAS_ALIBI", "HAS_KEEP", "VARLEN", "DROPOUT")

# The backward's two ways of summing dQ (kernels.py): "split", float32 accumulators of each split's own, summed in a
# fixed order (bit-identical passes), or "atomic", one accumulator a program per key block adds into atomically.
# CONVATTN_TRITON_DQ chooses; by default (auto), torch.use_deterministic_algorithms(True) keeps "split", and
# otherwise auto_dq_design chooses on a GPU, from the two designs' times in the GPU call (bash
# benchmarks/gpu_session.sh times both).
DQ_DESIGNS = ("auto", "split", "atomic")
DQ_ENVIRONMENT = "CONVATTN_TRITON_DQ"


def auto_dq_design(accumulator_bytes: int, l2_bytes: int, row_edges: bool) -> str:
    """The dQ design "auto" takes on a GPU: split while its accumulators fit in half the L2 cache; past that atomic
    adds, unless the row table's clipped edge columns are accumulated too, which every key block of a row adds
    into: on the 2026-11-30 H200 call at 2 x 12 x 8,192 atomic adds were 0-4 % faster without them and 13-15 %
    slower with them (the row table 7.60 against 6.60 ms, composite+key 13.38 against 11.87:
    benchmarks/results/gpu_session/2026-11-30/kernels.json)."""
    return "split" if row_edges or accumulator_bytes <= l2_bytes // 2 else "atomic"


@cache
def autotuned(kernel: str, head_dim: int, dtype: torch.dtype) -> triton.runtime.Autotuner:
    """The kernel autotuned over `configs`, keyed by the length bucket and TUNING_KEY: the tilings are timed at a
    key's first call, its pick launched from then on (the first tiling alone under the interpreter)."""
    tilings = configs(kernel, head_dim, dtype)
    if any(m % 16 or n % 32 for m, n, _, _ in tilings):
        raise ValueError(f"BLOCK_M must be a multiple of 16 and BLOCK_N of 32 (dropout_keep's query pairs and key "
                         f"chunks); got {tilings}")
    options = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in tilings]
    # the backward adds to its accumulators: the tilings' trial runs start them from zero. cache_results: the picks
    # go to Triton's cache on disk beside the compiled tilings, so a later process (the next run, a comparison's
    # next row) launches them without timing every tiling again (Triton keeps none under the interpreter)
    key = ["length_bucket", *TUNING_KEY, *(["ATOMIC", "FOLD_KEY"] if kernel == "backward" else [])]
    tuned = triton.autotune(configs=options, key=key, cache_results=True,
                            reset_to_zero=["DQ_ACC", "DA_ACC"] if kernel == "backward" else None)(KERNELS[kernel])
    AUTOTUNERS[kernel, head_dim, dtype] = tuned
    return tuned


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
    dtype and layout, or float32 where the table is broadcast over the batch (the operator sums it). An empty tensor
    for an absent table (an operator returns no None)."""
    if table is None:
        return q.new_empty(0, dtype=torch.float32)
    if varlen or table.shape[0] == q.shape[0]:
        return torch.empty_like(table)  # its strides where dense (launch.table_like's), else contiguous
    return q.new_empty((q.shape[0], *table.shape[1:]), dtype=torch.float32)


def memory_order(x: Tensor) -> list[int]:
    """x's leading axes (all but the last) from the outermost in memory to the innermost: a padded (b, h, n, d) view
    of (b, n, h, d) projections gives [0, 2, 1]."""
    return sorted(range(x.dim() - 1), key=lambda axis: x.stride(axis), reverse=True)


def table_like(x: Tensor, width: int) -> Tensor:
    """An empty table for x's rows, (*x.shape[:-1], width) in x's dtype, its rows laid out in x's order: the
    projections' gradients (operator.py) then read x and the table's gradient as two matrices without a copy."""
    order = memory_order(x)
    table = x.new_empty([x.shape[axis] for axis in order] + [width])
    return table.permute(*sorted(range(len(order)), key=order.__getitem__), len(order))


def projection_block_width(width: int) -> int:
    """The columns a table's product computes (BLOCK_W): a power of two, at least 16 (tl.dot's smallest)."""
    return max(16, 1 << (width - 1).bit_length())


class Problem:
    """Shapes, strides and constexprs shared by the kernels of one call."""

    def __init__(self, q: Tensor, row_table: Tensor | None, key_table: Tensor | None, keep: Tensor | None,
                 cu_seqlens: Tensor | None, seed: Tensor | None, max_seqlen: int, reach: int, clip: bool,
                 dropout_p: float, scale: float, alibi_slopes: Tensor | None = None,
                 query_kernel: Tensor | None = None, key_kernel: Tensor | None = None, table_scale: float = 1.0):
        self.varlen = cu_seqlens is not None
        self.stats_shape = stats_shape(q, self.varlen)
        self.stats_size = math.prod(self.stats_shape)
        if self.varlen:
            total, self.heads, self.head_dim = q.shape
            self.batch, self.seqlen = cu_seqlens.numel() - 1, max_seqlen
            self.stats_strides = (0, total)
        else:
            self.batch, self.heads, self.seqlen, self.head_dim = q.shape
            self.stats_strides = (self.heads * self.seqlen, self.seqlen)
        self.row_table, self.key_table, self.keep, self.cu_seqlens = row_table, key_table, keep, cu_seqlens
        self.seed, self.scale, self.dropout_p = seed, scale, kernel_dropout_p(dropout_p)
        self.alibi_slopes = alibi_slopes
        # the backward's folds: a table projected from q or k sends its share of their gradient inside the kernels
        self.query_kernel, self.key_kernel, self.table_scale = query_kernel, key_kernel, table_scale
        self.block_w = projection_block_width(2 * reach + 1)
        self.keep_stride = keep.stride(0) if keep is not None else 0
        self.constants = dict(REACH=reach, CLIP=clip, HAS_ROW=row_table is not None, HAS_KEY=key_table is not None,
                              HAS_ALIBI=alibi_slopes is not None, HAS_KEEP=keep is not None, VARLEN=self.varlen,
                              DROPOUT=dropout_p > 0, HEAD_DIM=self.head_dim,
                              BLOCK_D=max(16, 1 << (self.head_dim - 1).bit_length()),
                              PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
        # the keyword arguments of every autotuned launch: the constexprs, and length_bucket, the next power of two of
        # the length, which the kernels ignore and the autotuner keys on (one tuning per bucket, not per length)
        self.keywords = dict(length_bucket=1 << max(self.seqlen - 1, 0).bit_length(), **self.constants)

    def operands(self, q: Tensor) -> list:
        """The pointers the forward and backward kernels take after q, k, v: tables, key mask, sequence offsets,
        dropout's seed, ALiBi's slopes (q where absent)."""
        return [q if t is None else t for t in (self.row_table, self.key_table, self.keep, self.cu_seqlens,
                                                self.seed, self.alibi_slopes)]

    def scalars(self) -> list:
        """p_drop, scale, seqlen, rng_stride (dropout's Philox counters per query pair: four per 32 keys) and
        heads."""
        return [self.dropout_p, self.scale, self.seqlen, 4 * -(-self.seqlen // 32), self.heads]

    def table_strides(self) -> list[int]:
        return [*strides(self.row_table, self.varlen), *strides(self.key_table, self.varlen), self.keep_stride,
                *self.stats_strides]

    def forward_arguments(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor) -> list:
        """The forward kernel's runtime arguments, before length_bucket and the constexprs (`keywords`)."""
        return [q, k, v, *self.operands(q), out, lse, *self.scalars(), *strides(q, self.varlen),
                *strides(k, self.varlen), *strides(v, self.varlen), *strides(out, self.varlen),
                *self.table_strides()]

    def splits(self, q: Tensor) -> int:
        """How many float32 accumulators of dQ the backward deals the key blocks of a (sequence, head) among: enough
        programs (splits times sequences times heads) for one per multiprocessor, as FlashAttention-2's deterministic
        backward launches, and no more than the key blocks at the smallest tiling. Under the interpreter, up to 8
        programs, so that the tests meet several splits and several key blocks per split. Untimed on a GPU."""
        programs = 8 if interpreting() else multiprocessors(q.device)
        return max(1, min(-(-programs // (self.batch * self.heads)), self.key_blocks(q)))

    def key_blocks(self, q: Tensor) -> int:
        """The key blocks of the longest sequence at the narrowest backward tiling: the atomic design's programs
        per (sequence, head), one block each whichever tiling the autotuner picks."""
        smallest = min(config.kwargs["BLOCK_N"] for config in autotuned("backward", self.head_dim, q.dtype).configs)
        return max(1, -(-self.seqlen // smallest))

    def dq_design(self, q: Tensor, splits: int) -> str:
        """"split" or "atomic" for this call (DQ_DESIGNS), `splits` the split design's accumulators; one line naming
        the variable for a value it cannot take."""
        asked = os.environ.get(DQ_ENVIRONMENT, "auto") or "auto"
        if asked not in DQ_DESIGNS:
            raise ValueError(f"{DQ_ENVIRONMENT}={asked!r}: choose one of {', '.join(DQ_DESIGNS)} (the fused "
                             "kernel's backward: split accumulators, bit-identical; or atomic adds)")
        if torch.are_deterministic_algorithms_enabled():
            if asked == "atomic" and not torch.is_deterministic_algorithms_warn_only_enabled():
                raise RuntimeError(f"{DQ_ENVIRONMENT}=atomic sums dQ in any order, and "
                                   "torch.use_deterministic_algorithms(True) asks for the same bits every time: "
                                   f"unset {DQ_ENVIRONMENT} (the split design is deterministic)")
            return "split"
        if asked != "auto":
            return asked
        if q.device.type != "cuda":
            return "split"
        return auto_dq_design(splits * q.numel() * 4, torch.cuda.get_device_properties(q.device).L2_cache_size,
                              self.constants["HAS_ROW"] and self.constants["CLIP"])

    def accumulators(self, q: Tensor, splits: int) -> tuple[Tensor, Tensor]:
        """(dQ's, the row table's edge columns') float32 accumulators, `splits` of them (one for the atomic design):
        (splits, *q.shape) and (splits, 2, *stats_shape), the latter empty without a row table in clip mode. Sets
        accumulator_strides: the split's, then the (batch, head, position) strides of dQ's."""
        dq = torch.empty((splits, *q.shape), dtype=torch.float32, device=q.device)
        edges = self.constants["HAS_ROW"] and self.constants["CLIP"]
        da = torch.empty((splits, 2, *self.stats_shape) if edges else (0,), dtype=torch.float32, device=q.device)
        self.accumulator_strides = [dq.stride(0), *strides(dq[0], self.varlen)]
        return dq, da

    def preprocess_arguments(self, grad_out: Tensor, out: Tensor, delta: Tensor, dq_acc: Tensor,
                             da_acc: Tensor) -> tuple[list, dict]:
        """backward_preprocess's runtime arguments and constexprs; dO and O have q's strides."""
        return ([grad_out, out, delta, dq_acc, da_acc, self._offsets(grad_out), self.seqlen, self.heads,
                 dq_acc.shape[0], self.stats_size, *strides(grad_out, self.varlen), *self.stats_strides,
                 *self.accumulator_strides],
                dict(ROW_EDGES=da_acc.numel() > 0, VARLEN=self.varlen, HEAD_DIM=self.head_dim,
                     BLOCK_D=self.constants["BLOCK_D"], BLOCK_M=ROWS))

    def backward_arguments(self, q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, lse: Tensor, delta: Tensor,
                           grad_k: Tensor, grad_v: Tensor, grad_row: Tensor | None, grad_key: Tensor | None,
                           dq_acc: Tensor, da_acc: Tensor, splits: int) -> list:
        """backward_kernel's runtime arguments, before length_bucket and the constexprs (`keywords`); dO has q's
        strides; grad_row and grad_key None without their table."""
        p_drop, scale, *sizes = self.scalars()
        return [q, k, v, *self.operands(q), grad_out, lse, delta, grad_k, grad_v,
                q if grad_row is None else grad_row, q if grad_key is None else grad_key, dq_acc, da_acc,
                q if self.key_kernel is None else self.key_kernel, p_drop, scale, self.table_scale, *sizes, splits,
                self.stats_size, *strides(q, self.varlen),
                *strides(k, self.varlen), *strides(v, self.varlen), *self.table_strides(),
                *strides(grad_row, self.varlen), *strides(grad_key, self.varlen), *self.accumulator_strides]

    def backward_constants(self, atomic: bool) -> dict:
        """backward_kernel's own constexprs beside `keywords`: the dQ design, and whether the key table was
        projected from the keys (its share of dK added inside the kernel)."""
        return dict(ATOMIC=atomic, FOLD_KEY=self.constants["HAS_KEY"] and self.key_kernel is not None,
                    BLOCK_W=self.block_w)

    def query_arguments(self, dq_acc: Tensor, da_acc: Tensor, grad_q: Tensor,
                        grad_row: Tensor | None) -> tuple[list, dict]:
        """query_gradient_kernel's runtime arguments and constexprs (grad_row None without a row table)."""
        fold = grad_row is not None and self.query_kernel is not None
        return ([dq_acc, da_acc, grad_q if self.keep is None else self.keep, self._offsets(grad_q), grad_q,
                 grad_q if grad_row is None else grad_row, self.query_kernel if fold else grad_q, self.scale,
                 self.table_scale, self.seqlen, self.heads, dq_acc.shape[0], self.stats_size,
                 *self.accumulator_strides, *self.stats_strides, self.keep_stride, *strides(grad_q, self.varlen),
                 *strides(grad_row, self.varlen)],
                dict(REACH=self.constants["REACH"], CLIP=self.constants["CLIP"], HAS_ROW=grad_row is not None,
                     HAS_KEEP=self.keep is not None, VARLEN=self.varlen, FOLD_ROW=fold, HEAD_DIM=self.head_dim,
                     BLOCK_D=self.constants["BLOCK_D"], BLOCK_M=ROWS, BLOCK_W=self.block_w,
                     PRECISION=self.constants["PRECISION"]))

    def _offsets(self, q: Tensor) -> Tensor:
        return q if self.cu_seqlens is None else self.cu_seqlens

    def grid(self, along: str):
        return lambda meta: (-(-self.seqlen // meta[along]), self.batch * self.heads)

    def rows_grid(self) -> tuple[int, int]:
        """The grid of the kernels that stream ROWS rows a program."""
        return -(-self.seqlen // ROWS), self.batch * self.heads


@cache
def multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# ---------------------------------------------------------------------------------------------------------------------
# launches


_direct = threading.local()


@contextmanager
def direct_launches():
    """Within it, this thread's launches call the kernels as they are: the eager path (operator._EagerAttention),
    where nothing traces them, as a triton_op's own eager call does."""
    before = getattr(_direct, "on", False)
    _direct.on = True
    try:
        yield
    finally:
        _direct.on = before


def wrapped(kernel):
    """The kernel as it is inside direct_launches(), else through torch.library.wrap_triton: a call torch.compile's
    tracing sees (and inductor launches itself); a triton_op's eager call, and the interpreter, get the kernel."""
    return kernel if getattr(_direct, "on", False) else torch.library.wrap_triton(kernel)


def launch(kernel: str, problem: Problem, grid, arguments: list, **constants) -> None:
    """One launch of an autotuned kernel (`wrapped`). `constants`: the kernel's own constexprs beside the shared
    `keywords`."""
    tuned = autotuned(kernel, problem.head_dim, arguments[0].dtype)
    wrapped(tuned)[grid](*arguments, **problem.keywords, **constants)


def run_tables(q: Tensor, k: Tensor, fixed: Tensor | None, query_kernel: Tensor | None, key_kernel: Tensor | None,
               table_scale: float) -> tuple[Tensor, Tensor]:
    """(row table, key table) projected from q and k, each laid out as its operand (table_like), in one launch of
    tables_kernel: fixed + q W * table_scale where query_kernel is W, k U * table_scale where key_kernel is U; an
    empty tensor for a table not asked for. q, k padded (b, h, n, d) or packed (total, h, d); W, U (d, 2r + 1) and
    fixed (h, 2r + 1) contiguous."""
    row, key = projected_tables(q, k, query_kernel, key_kernel)
    grid, arguments, constants = tables_arguments(q, k, fixed, query_kernel, key_kernel, row, key, table_scale)
    wrapped(kernels.tables_kernel)[grid](*arguments, **constants, num_warps=4)
    return row, key


def projected_tables(q: Tensor, k: Tensor, query_kernel: Tensor | None,
                     key_kernel: Tensor | None) -> tuple[Tensor, Tensor]:
    """run_tables' outputs, unwritten: a table laid out as its operand (table_like) where its kernel is given, else
    an empty tensor (an operator returns no None). The operator's fake implementation returns these too."""
    width = (query_kernel if query_kernel is not None else key_kernel).shape[-1]
    return tuple(table_like(x, width) if kernel is not None else x.new_empty(0)
                 for x, kernel in ((q, query_kernel), (k, key_kernel)))


def tables_arguments(q: Tensor, k: Tensor, fixed: Tensor | None, query_kernel: Tensor | None,
                     key_kernel: Tensor | None, row: Tensor, key: Tensor, table_scale: float) -> tuple:
    """tables_kernel's (grid, runtime arguments, constexprs) for run_tables: a program per ROWS rows of a (batch,
    head), a packed stream being one batch."""
    padded = q.dim() == 4
    batch, heads, rows = (q.shape[:3] if padded else (1, q.shape[1], q.shape[0]))

    def row_strides(x: Tensor | None) -> tuple[int, int, int]:
        if x is None:
            return 0, 0, 0
        return strides(x, False) if padded else (0, x.stride(1), x.stride(0))

    row, key = (table if kernel is not None else None for table, kernel in ((row, query_kernel), (key, key_kernel)))
    arguments = [q, k, *(q if t is None else t for t in (fixed, query_kernel, key_kernel, row, key)), table_scale,
                 rows, heads, *row_strides(q), *row_strides(k), *row_strides(row), *row_strides(key)]
    head_dim, width = q.shape[-1], (query_kernel if query_kernel is not None else key_kernel).shape[-1]
    constants = dict(BUILD_ROW=row is not None, BUILD_KEY=key is not None, HAS_FIXED=fixed is not None, WIDTH=width,
                     HEAD_DIM=head_dim, BLOCK_D=max(16, 1 << (head_dim - 1).bit_length()),
                     BLOCK_W=projection_block_width(width), BLOCK_M=ROWS,
                     PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    return (-(-rows // ROWS), batch * heads), arguments, constants


def run_forward(q: Tensor, k: Tensor, v: Tensor, row_table: Tensor | None, key_table: Tensor | None,
                keep: Tensor | None, cu_seqlens: Tensor | None, seed: Tensor | None, max_seqlen: int, reach: int,
                clip: bool, dropout_p: float, scale: float,
                alibi_slopes: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(out, log2-sum-exp of every query row in float32)."""
    problem = Problem(q, row_table, key_table, keep, cu_seqlens, seed, max_seqlen, reach, clip, dropout_p, scale,
                      alibi_slopes)
    out = torch.empty_like(q)
    lse = torch.empty(problem.stats_shape, dtype=torch.float32, device=q.device)
    launch("forward", problem, problem.grid("BLOCK_M"), problem.forward_arguments(q, k, v, out, lse))
    return out, lse


def run_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                 row_table: Tensor | None, key_table: Tensor | None, keep: Tensor | None, cu_seqlens: Tensor | None,
                 seed: Tensor | None, max_seqlen: int, reach: int, clip: bool, dropout_p: float, scale: float,
                 alibi_slopes: Tensor | None = None, query_kernel: Tensor | None = None,
                 key_kernel: Tensor | None = None,
                 table_scale: float = 1.0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, d row table, d key table), the tables' per (sequence, head, position): backward_preprocess,
    backward_kernel into `splits` accumulators or atomically into one (`Problem.dq_design`), query_gradient_kernel
    summing them. With query_kernel (key_kernel), the row (key) table was projected from q (k) by run_tables: dq
    (dk) holds the table's share of the gradient too."""
    problem = Problem(q, row_table, key_table, keep, cu_seqlens, seed, max_seqlen, reach, clip, dropout_p, scale,
                      alibi_slopes, query_kernel, key_kernel, table_scale)
    # the kernels read dO and O with q's strides
    grad_out, out = (x if x.stride() == q.stride() else torch.empty_like(q).copy_(x) for x in (grad_out, out))
    delta = torch.empty(problem.stats_shape, dtype=torch.float32, device=q.device)
    splits = problem.splits(q)
    atomic = problem.dq_design(q, splits) == "atomic"
    splits = problem.key_blocks(q) if atomic else splits
    dq_acc, da_acc = problem.accumulators(q, 1 if atomic else splits)
    grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grad_row, grad_key = (table_gradient(table, q, problem.varlen) for table in (row_table, key_table))
    grad_row_or_none = grad_row if row_table is not None else None
    arguments, constants = problem.preprocess_arguments(grad_out, out, delta, dq_acc, da_acc)
    wrapped(kernels.backward_preprocess)[problem.rows_grid()](*arguments, **constants, num_warps=4)
    launch("backward", problem, problem.grid("BLOCK_N") if atomic else (splits, problem.batch * problem.heads),
           problem.backward_arguments(q, k, v, grad_out, lse, delta, grad_k, grad_v, grad_row_or_none,
                                      grad_key if key_table is not None else None, dq_acc, da_acc, splits),
           **problem.backward_constants(atomic))
    arguments, constants = problem.query_arguments(dq_acc, da_acc, grad_q, grad_row_or_none)
    wrapped(kernels.query_gradient_kernel)[problem.rows_grid()](*arguments, **constants, num_warps=4)
    return grad_q, grad_k, grad_v, grad_row, grad_key
