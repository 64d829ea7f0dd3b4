"""The one place that chooses how attention with relative terms is computed: every mechanism with relative
terms (composite attention, ConvBERT's self-attention heads) calls `relative_attention`."""

from __future__ import annotations

import importlib.util
import os
import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import numpy as np
import torch
from torch import Tensor
from transformers import AttentionInterface

from convattn.attention.core import PackedSequences, TokenMask, attend, is_tracing, merge_heads, split_heads
from convattn.attention.relative.bias import RelativePositionBias
from convattn.attention.relative.blockwise import blockwise_relative_attention
from convattn.attention.relative.decomposition import decomposed_relative_attention
from convattn.attention.relative.flex import flex_relative_attention
from convattn.attention.relative.kernels import fused_kernel
from convattn.attention.relative.toeplitz import toeplitz_alibi_attention
from convattn.attn_implementations import TRITON_IMPLEMENTATION

# Below this length the dense bias (SDPA's math kernel) is as fast on CPU as the decomposition and small; at 256
# the decomposition took 1.53x plain SDPA's time against the dense bias's 1.67x (composite, one layer, forward and
# backward). Measure again: python benchmarks/attention_layer.py --shapes 128x16,256x16 --decomposed-from N
# ALiBi alone takes the Toeplitz view from here on, where the dense bias would hold n x n: below, the dense bias is
# as fast or faster (the view's copies of k and v weigh more where each query has few keys). Measure again: python
# benchmarks/attention_layer.py --shapes 128x64,256x32 --arms none,alibi-dense,alibi-toeplitz
CPU_DECOMPOSED_MIN_LENGTH = 256
# From this length on the blockwise path serves attention dropout on CPU, whose fused kernel has no dropout: it
# computes the forward twice, worth it where the dense bias's memory grows as n^2 (at 2,048 half the dense bias's
# peak memory). Measure again: python benchmarks/attention_layer.py --attention-dropout 0.1 --decomposed-from N
CPU_BLOCKWISE_MIN_LENGTH = 2048

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
RELATIVE_PATHS = ("triton", "toeplitz", "decomposed", "blockwise", "flex", "dense")
# The path `forced_path` set, per thread. Not a contextvars.ContextVar: torch.compile (2.13) cannot trace its
# get (a graph break, refused under fullgraph=True), while it reads a threading.local's attribute and guards on
# its value, so a compiled graph follows the forced path as eager code does. A plain threading.local read with a
# getattr default: in a subclass with a class-level default, the guard missed a later forced path.
_forcing = threading.local()


def _forced_path() -> str | None:
    return getattr(_forcing, "path", None)


@contextmanager
def forced_path(name: str) -> Iterator[None]:
    """Take path `name` (one of RELATIVE_PATHS) wherever the attention probabilities are not asked for, whatever
    the device and length, in this thread: the benchmarks' and tests' way to run one path against another."""
    if name not in RELATIVE_PATHS:
        raise ValueError(f"path must be one of {', '.join(RELATIVE_PATHS)}; got {name!r}")
    previous, _forcing.path = _forced_path(), name
    try:
        yield
    finally:
        _forcing.path = previous


@cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string: "2.4.0rc1" -> (2, 4)."""
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()
    return int(major), int(minor)


def _interpreter_fails_with_numpy() -> bool:
    """triton's interpreter up to 3.6 converts one-element arrays to ints, which numpy 2.4 made an error
    (triton-lang/triton#9171)."""
    import triton

    return _release(np.__version__) >= (2, 4) and _release(triton.__version__) <= (3, 6)


def interpreting() -> bool:
    """Whether triton runs its kernels on the CPU (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_unavailable() -> tuple[type[Exception], str] | None:
    """Why the fused kernel cannot run in this process, as (the error to raise, what to do), or None when it can:
    triton missing, its interpreter with a numpy it fails with, or neither a CUDA GPU nor the interpreter."""
    if importlib.util.find_spec("triton") is None:
        return ImportError, "needs triton, which is not installed: pip install triton"
    if interpreting() and _interpreter_fails_with_numpy():
        return ImportError, (f"runs on CPU under triton's interpreter (TRITON_INTERPRET=1), which fails with numpy "
                             f"{np.__version__}: pip install \"numpy<2.4\"")
    if not interpreting() and not torch.cuda.is_available():
        return RuntimeError, ("runs on a CUDA GPU, and this machine has none: on CPU set TRITON_INTERPRET=1 before "
                              "triton is imported (its interpreter: slow, for tests), or choose attn_implementation "
                              "'sdpa'")
    return None


def check_triton_available() -> None:
    """One error naming what to install or set when the kernel's attn_implementation (TRITON_IMPLEMENTATION)
    cannot run here."""
    if (problem := triton_unavailable()) is not None:
        error, what_to_do = problem
        raise error(f"attn_implementation={TRITON_IMPLEMENTATION!r} {what_to_do}")


def _check_kernel_device(device: torch.device) -> None:
    """The tensors are where the kernel runs: on CUDA, or on CPU under the interpreter."""
    if interpreting() and device.type != "cpu":
        raise RuntimeError(f"attn_implementation={TRITON_IMPLEMENTATION!r} runs on CPU tensors under "
                           f"TRITON_INTERPRET=1, and these are on {device}: unset TRITON_INTERPRET to run it on the "
                           "GPU, or move the model to the CPU")
    if not interpreting() and device.type != "cuda":
        raise RuntimeError(f"attn_implementation={TRITON_IMPLEMENTATION!r} runs on a CUDA GPU, and this model is on "
                           f"{device}: move it there (model.cuda()), or on CPU set TRITON_INTERPRET=1 before triton "
                           "is imported (its interpreter: slow, for tests), or choose attn_implementation 'sdpa'")


def _kernel(device: torch.device):
    """`triton_relative_attention`, once the kernel is known to run on `device` (one line saying what to install
    or set where it cannot)."""
    if not is_tracing():
        check_triton_available()
        _check_kernel_device(device)
    from convattn.attention.relative.triton_attention import triton_relative_attention

    return triton_relative_attention


def _triton_serves(attn_implementation: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the fused kernel computes attention with relative terms: asked for by name, or by default on CUDA
    in the dtypes it has, wherever triton is installed (`relative_path` asks it after the paths that come first)."""
    return attn_implementation == TRITON_IMPLEMENTATION or (
        device.type == "cuda" and dtype in TRITON_DTYPES and triton_installed())


def relative_path(q: Tensor, attn_implementation: str, dropout_p: float, need_weights: bool,
                  alibi_alone: bool = False) -> str:
    """"triton" (triton_attention.py: one fused kernel, forward and backward, dropout included, an operator that
    torch.compile keeps whole; the kernel's attn_implementation, and the CUDA default),
    "toeplitz" (ALiBi without relative terms, `alibi_alone`, on CPU from 256 tokens on, no dropout: toeplitz.py,
    the CPU flash kernel with the bias as a strided view),
    "decomposed" (decomposition.py, exact, O(n (2r + 1)) beside the fused kernels; one custom operator under
    torch.compile), "blockwise" (CPU with dropout, blockwise.py, eager only: its checkpoints split a compiled
    graph), "flex" (attn_implementation="flex_attention", no dropout, heads of 16 channels or more) or "dense"
    (the (n x n) bias: attention maps, "eager", short sequences on CPU, float64 on CUDA, and graphs traced by
    torch.export / ONNX, where a length test would pin the dynamic sequence axis)."""
    if need_weights or attn_implementation == "eager" or torch.compiler.is_exporting():
        return "dense"
    if (forced := _forced_path()) is not None:
        return forced
    if attn_implementation == "flex_attention":
        return "flex" if dropout_p == 0.0 and q.shape[-1] >= 16 else "dense"
    # On CUDA the kernel is the default at every length: on an H200 it was faster than the decomposition from n = 128
    # to 8,192 (at least 1.1x) and than the dense bias from n = 512 (python benchmarks/attention_gpu.py)
    if _triton_serves(attn_implementation, q.device, q.dtype):
        return "triton"
    kernel, n = fused_kernel(q.device, q.dtype), q.shape[-2]
    if kernel is None:
        return "dense"
    if q.device.type != "cpu":
        return "decomposed"
    if dropout_p == 0.0:
        if n < CPU_DECOMPOSED_MIN_LENGTH:
            return "dense"
        return "toeplitz" if alibi_alone else "decomposed"
    return "blockwise" if n >= CPU_BLOCKWISE_MIN_LENGTH and not torch.compiler.is_compiling() else "dense"


def relative_attention(q: Tensor, k: Tensor, v: Tensor, relative: RelativePositionBias | None, mask: TokenMask, *,
                       dropout_p: float, attn_implementation: str, need_weights: bool = False,
                       tables_from: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T / sqrt(d) + relative terms + padding mask) with dropout, times v: q, k, v (batch, heads,
    n, d) -> (batch, heads, n, d), and the probabilities when `need_weights`; plain attention without terms.
    tables_from: the queries and keys (as q, k) that the dynamic relative terms read, where they are not q and k:
    under rotary positions q and k are turned by their positions, and terms read from them would depend on where
    a sequence sits, not only on offsets; the terms read the projections before the rotation."""
    if relative is None and attn_implementation == TRITON_IMPLEMENTATION and not need_weights:
        return _triton(q, k, v, None, mask, dropout_p), None
    if relative is None:
        return attend(q, k, v, bias=None, mask=mask, dropout_p=dropout_p, attn_implementation=attn_implementation,
                      need_weights=need_weights)
    if relative.alibi is not None and q.device.type == "cpu":
        _say_denormals(max(relative.alibi), q.shape[-2])
    path = relative_path(q, attn_implementation, dropout_p, need_weights, relative.alibi_alone)
    if path == "toeplitz":
        return _toeplitz(q, k, v, relative, mask, dropout_p), None
    keep = mask.keep if mask.has_padding else None
    table_q, table_k = tables_from or (q, k)
    if path == "decomposed":
        if relative.alibi is not None and q.dtype in (torch.float16, torch.bfloat16):
            # ALiBi's per-key constants grow with the length (m_h n / 2) and ride on a column of k: in half
            # precision they would lose whole units, so these operands attend in float32
            pieces = relative.pieces(table_q.float(), table_k.float())
            out = decomposed_relative_attention(*(x.float() for x in (q, k, v)), pieces, keep, relative.reach,
                                                dropout_p, fused_kernel(q.device, torch.float32))
            return out.to(q.dtype), None
        kernel = fused_kernel(q.device, q.dtype)
        return decomposed_relative_attention(q, k, v, relative.pieces(table_q, table_k), keep, relative.reach,
                                             dropout_p, kernel), None
    if path == "triton":
        return _triton(q, k, v, relative, mask, dropout_p, tables_from), None
    if path == "blockwise":
        return blockwise_relative_attention(q, k, v, relative, mask, dropout_p, tables_from), None
    if path == "flex":
        return flex_relative_attention(q, k, v, relative, keep, tables_from), None
    return attend(q, k, v, bias=relative(table_q, table_k), mask=mask, dropout_p=dropout_p,
                  attn_implementation=attn_implementation, need_weights=need_weights)


def _toeplitz(q: Tensor, k: Tensor, v: Tensor, relative: RelativePositionBias, mask: TokenMask,
              dropout_p: float) -> Tensor:
    if not relative.alibi_alone or dropout_p:
        raise ValueError("the toeplitz path computes ALiBi alone without dropout; this layer has "
                         + ("dropout on its probabilities" if dropout_p else "relative terms beside ALiBi"))
    if q.dtype in (torch.float16, torch.bfloat16):
        # the bias reaches m_h n, whole units that half precision would lose: these operands attend in float32
        out = toeplitz_alibi_attention(q.float(), k.float(), v.float(), relative.slopes(q), mask)
        return out.to(q.dtype)
    return toeplitz_alibi_attention(q, k, v, relative.slopes(q), mask)


# exp() of a float32 below -87.3 is denormal (under 2^-126): ALiBi's bias alone reaches it where its steepest slope
# times the longest distance does (convattn.denormals)
DENORMAL_EXPONENT = 87.3
_denormals_said = False


def _say_denormals(slope: float, n: int) -> None:
    """Warn once a process where ALiBi's bias over `n` tokens reaches the denormal range on a CPU thread that keeps
    denormal floats: on x86 they made an ALiBi layer 2-5x slower (RESULTS 8.8, 8.9). The command line flushes them."""
    global _denormals_said
    if is_tracing() or _denormals_said or slope * (n - 1) < DENORMAL_EXPONENT:  # a traced graph reads no global
        return
    from convattn.denormals import denormals_flushed

    if denormals_flushed():
        return
    _denormals_said = True
    warnings.warn(f"ALiBi's far scores over {n} tokens make denormal floats, which x86 CPUs compute many times more "
                  "slowly (one ALiBi layer at 2,048 tokens: 4.7x plain SDPA's time on an Intel Xeon, 1.05x with them "
                  "flushed; RESULTS 8.9): call torch.set_flush_denormal(True) first thing in the script, before torch "
                  "starts its threads, as the convattn command line does", RuntimeWarning, stacklevel=2)


def attention_per_sequence(query: Tensor, key: Tensor, value: Tensor, num_heads: int,
                           relative: RelativePositionBias | None, mask: TokenMask | PackedSequences, *,
                           dropout_p: float, attn_implementation: str, need_weights: bool = False,
                           tables_from: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor | None]:
    """`relative_attention` of the projections (batch, n, heads * d) -> context (batch, n, heads * d), each sequence
    attending within itself: a padded batch as it is, a packed stream (1, total, heads * d) through the fused
    kernel's variable-length interface where it serves, otherwise on zero-padded blocks of sequences of similar
    lengths. The probabilities, when asked, are those of one block of all sequences (batch, heads, longest,
    longest). tables_from: the projections the relative terms read, as query and key (`relative_attention`)."""
    if isinstance(mask, PackedSequences) and not need_weights and _packed_kernel_serves(query, relative,
                                                                                         attn_implementation,
                                                                                         dropout_p):
        return _triton_packed(query, key, value, num_heads, relative, mask, dropout_p, tables_from), None
    probs = []

    def attend_block(query: Tensor, key: Tensor, value: Tensor, *table_inputs_and_mask) -> Tensor:
        *table_inputs, block_mask = table_inputs_and_mask
        q, k, v, *tables_from_heads = (split_heads(x, num_heads) for x in (query, key, value, *table_inputs))
        context, block_probs = relative_attention(q, k, v, relative, block_mask, dropout_p=dropout_p,
                                                  attn_implementation=attn_implementation, need_weights=need_weights,
                                                  tables_from=tuple(tables_from_heads) or None)
        probs.append(block_probs)
        return merge_heads(context)

    return mask.per_block(attend_block, query, key, value, *(tables_from or ()), grouped=not need_weights), probs[0]


def _packed_kernel_serves(query: Tensor, relative: RelativePositionBias | None, attn_implementation: str,
                          dropout_p: float) -> bool:
    """Whether packed sequences take the kernel's variable-length interface: always under the kernel's
    attn_implementation, and otherwise where `relative_path` would choose the kernel for relative terms on a
    padded batch of these projections (its rule reads their device and dtype). A forced path, the kernel's too,
    runs on padded blocks."""
    if attn_implementation == TRITON_IMPLEMENTATION:
        return True
    return (relative is not None and _forced_path() is None
            and relative_path(query, attn_implementation, dropout_p, False) == "triton")


def _triton_packed(query: Tensor, key: Tensor, value: Tensor, num_heads: int, relative: RelativePositionBias | None,
                   mask: PackedSequences, dropout_p: float, tables_from: tuple[Tensor, Tensor] | None = None) -> Tensor:
    triton_relative_attention = _kernel(query.device)
    total = query.shape[1]
    q, k, v = (x.flatten(0, 1).unflatten(-1, (num_heads, -1)) for x in (query, key, value))  # (total, heads, d)

    def packed_tables(table_q: Tensor, table_k: Tensor) -> tuple[Tensor | None, Tensor | None]:
        # per token: computed on (1, heads, total, d) as for one row, then laid out (total, heads, w)
        tables = relative.tables(*(x.transpose(0, 1)[None] for x in (table_q, table_k)))
        return tuple(None if t is None else t[0].expand(num_heads, total, -1).transpose(0, 1).contiguous()
                     for t in tables)

    table_inputs = tuple(x.flatten(0, 1).unflatten(-1, (num_heads, -1)) for x in tables_from) if tables_from else None
    out = triton_relative_attention(q, k, v, **kernel_inputs(relative, q, k, table_inputs, packed_tables),
                                    dropout_p=dropout_p, cu_seqlens=mask.offsets,
                                    max_seqlen=mask.max_seqlen)
    return out.flatten(-2)[None]


def kernel_inputs(relative: RelativePositionBias | None, q: Tensor, k: Tensor,
                  tables_from: tuple[Tensor, Tensor] | None = None, tables=None) -> dict:
    """The fused kernel's relative terms for `relative` (None: none): the tables, or the parameters the kernel
    projects them with, its reach and clip, and ALiBi's slopes. A term that reads q or k (W, U) is projected inside
    the kernel's launches, unless the terms read other projections than the scores (tables_from: the unrotated ones
    under rotary positions); fixed terms ride with W, or alone as a table broadcast over the batch. ALiBi is no
    table: the kernel computes it from the positions, so ALiBi alone takes reach 0. tables(q, k): the tables of
    q and k in the kernel's layout (relative.tables for padded operands)."""
    if relative is None:
        return dict(row_table=None, key_table=None, reach=0, clip=True)
    tables = tables or relative.tables
    terms = dict(clip=relative.clip, alibi_slopes=relative.slopes(q))
    if tables_from is None and relative.reads_projections:
        projected = relative.query_kernel is not None
        row_table = None if projected or relative.fixed is None else tables(q, k)[0]
        return dict(row_table=row_table, key_table=None, fixed=relative.fixed if projected else None,
                    query_kernel=relative.query_kernel, key_kernel=relative.key_kernel,
                    reach=relative.reach, **terms)
    row_table, key_table = tables(*(tables_from or (q, k)))
    reach = relative.reach if row_table is not None or key_table is not None else 0
    return dict(row_table=row_table, key_table=key_table, reach=reach, **terms)


def _triton(q: Tensor, k: Tensor, v: Tensor, relative: RelativePositionBias | None, mask: TokenMask | None,
            dropout_p: float, tables_from: tuple[Tensor, Tensor] | None = None) -> Tensor:
    triton_relative_attention = _kernel(q.device)
    keep = mask.keep if mask is not None and mask.has_padding else None
    return triton_relative_attention(q, k, v, **kernel_inputs(relative, q, k, tables_from), keep=keep,
                                     dropout_p=dropout_p)


def triton_interface_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                               scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """The kernel in transformers' AttentionInterface (TRITON_IMPLEMENTATION), for any encoder: query, key, value
    (batch, heads, n, d) -> ((batch, n, heads, d), None). attention_mask must mask keys only (padding): a boolean
    mask (True = attend) or an additive one (0 = attend), (batch, 1, 1 or n, n); its first query row is read."""
    triton_relative_attention = _kernel(query.device)
    keep = None
    if attention_mask is not None:
        first_row = attention_mask[:, 0, 0, :]
        keep = first_row if first_row.dtype == torch.bool else first_row == 0
    out = triton_relative_attention(query, key, value, None, None, reach=0, clip=True, keep=keep, dropout_p=dropout,
                                    scale=scaling)
    return out.transpose(1, 2), None


# registered here, not only by `import convattn`, so that the modeling code saved beside a model
# (trust_remote_code, convattn not installed) accepts the name too
AttentionInterface.register(TRITON_IMPLEMENTATION, triton_interface_attention)
