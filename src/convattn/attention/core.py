"""What every attention mechanism shares: the padding mask and softmax attention itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor


def is_tracing() -> bool:
    """True while torch.compile, torch.export or the TorchScript tracer capture a graph."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing()


@dataclass
class TokenMask:
    """Which positions hold real tokens (True) and which hold padding (False), shape (batch, n)."""

    keep: Tensor
    _has_padding: bool | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def has_padding(self) -> bool:
        # a traced graph (torch.compile, torch.export, ONNX) cannot branch on the data, so it always masks;
        # masking a batch without padding is the same function, only slower. Eager mode asks the data once
        # (functools.cached_property would do, but its lock stops torch.compile on Python 3.11)
        if is_tracing():
            return True
        if self._has_padding is None:
            self._has_padding = not bool(self.keep.all())
        return self._has_padding

    def zero_pads(self, x: Tensor) -> Tensor:
        """Zero the pad rows of a (batch, n, channels) tensor, so convolutions cannot see them."""
        if not self.has_padding:
            return x
        return x * self.keep[..., None].to(x.dtype)

    def key_bias(self, dtype: torch.dtype) -> Tensor | None:
        """Additive score mask (batch, 1, 1, n): 0 at real keys, the dtype's minimum at pad keys."""
        if not self.has_padding:
            return None
        bias = torch.zeros(self.keep.shape, dtype=dtype, device=self.keep.device)
        return bias.masked_fill(~self.keep, torch.finfo(dtype).min)[:, None, None, :]

    # the same interface as PackedSequences, for mechanisms that take either: a padded batch is its own blocks
    def blocks(self, x: Tensor) -> Tensor:
        return x

    def stream(self, x: Tensor) -> Tensor:
        return x

    @property
    def block_mask(self) -> TokenMask:
        return self

    def convolve(self, conv: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        """conv (along the sequence axis of a (batch, n, channels) tensor) seeing zeros at the pad rows."""
        return conv(self.zero_pads(x))


@dataclass
class PackedSequences:
    """Sequences laid end to end in one row, (1, total, ...), with no padding: the padding-free layout.

    Token-wise layers (projections, feed-forward, layer norms) run on the stream as it is; what mixes positions
    (attention, convolutions) runs on `blocks`, one sequence per row of a zero-padded (batch, longest, ...) tensor,
    so that nothing reaches across a boundary, and `stream` puts the result back.
    cu_seqlens: (batch + 1,) offsets of the sequences in the stream, as flash-attn's variable-length API."""

    cu_seqlens: Tensor
    max_seqlen: int
    _block_mask: TokenMask | None = field(default=None, init=False, repr=False, compare=False)
    _block_index: Tensor | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_lengths(cls, lengths: Tensor) -> PackedSequences:
        cu_seqlens = F.pad(lengths.cumsum(0), (1, 0))
        return cls(cu_seqlens, int(lengths.max()))

    @property
    def lengths(self) -> Tensor:
        return self.cu_seqlens[1:] - self.cu_seqlens[:-1]

    @property
    def starts(self) -> Tensor:
        """The stream index of each sequence's first token."""
        return self.cu_seqlens[:-1]

    @property
    def block_mask(self) -> TokenMask:
        """The real positions of `blocks`: (batch, longest), each sequence from position 0."""
        if self._block_mask is None:
            positions = torch.arange(self.max_seqlen, device=self.cu_seqlens.device)
            self._block_mask = TokenMask(positions[None, :] < self.lengths[:, None])
        return self._block_mask

    @property
    def block_index(self) -> Tensor:
        """(total,): the row of the flattened (batch * longest) blocks that each stream token goes to."""
        if self._block_index is None:
            self._block_index = self.block_mask.keep.flatten().nonzero()[:, 0]
        return self._block_index

    def blocks(self, x: Tensor) -> Tensor:
        """(1, total, ...) -> (batch, longest, ...), zeros after each sequence."""
        batch = len(self.cu_seqlens) - 1
        padded = x.new_zeros(batch * self.max_seqlen, *x.shape[2:])
        return padded.index_copy(0, self.block_index, x[0]).unflatten(0, (batch, self.max_seqlen))

    def stream(self, x: Tensor) -> Tensor:
        """(batch, longest, ...) -> (1, total, ...): the inverse of `blocks`."""
        return x.flatten(0, 1).index_select(0, self.block_index)[None]

    def zero_pads(self, x: Tensor) -> Tensor:
        return x  # a stream has no pads

    def convolve(self, conv: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        """conv along each sequence of the stream x, seeing zeros beyond the sequence's ends."""
        return self.stream(conv(self.blocks(x)))


def attn_implementation(config) -> str:
    """transformers' attention implementation of a config ("sdpa" until a model or the user sets one), read at
    every forward so that `model.set_attn_implementation(...)` switches a built model."""
    return config._attn_implementation or "sdpa"


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(batch, n, heads * d) -> (batch, heads, n, d)."""
    batch, n, width = x.shape
    return x.view(batch, n, num_heads, width // num_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(batch, heads, n, d) -> (batch, n, heads * d)."""
    batch, heads, n, d = x.shape
    return x.transpose(1, 2).reshape(batch, n, heads * d)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    bias: Tensor | None,
    mask: TokenMask | None,
    dropout_p: float,
    attn_implementation: str,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T / sqrt(d) + bias + padding mask) v with dropout on the probabilities.

    q: (batch, heads, n, d); k, v: (batch, heads, m, d); bias broadcastable to (batch, heads, n, m);
    `mask` masks the m keys (None when keys are not token positions, e.g. Linformer's projections).
    "sdpa" (and "flex_attention", which has no score_mod to add here) hands everything to the fused
    kernel; "eager" computes the same function explicitly and can return the attention probabilities.
    """
    key_bias = mask.key_bias(q.dtype) if mask is not None else None
    if key_bias is not None:
        bias = key_bias if bias is None else bias + key_bias
    # no score_mod here, and keys that may be no token positions (Linformer): SDPA's kernel serves these names
    if attn_implementation in ("sdpa", "flex_attention", "convattn_triton") and not need_weights:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
        return out, None
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias
    probs = scores.softmax(dim=-1)
    out = torch.matmul(F.dropout(probs, dropout_p), v)
    return out, probs
