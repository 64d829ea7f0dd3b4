"""What every attention mechanism shares: the padding mask and softmax attention itself."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from convattn.attn_implementations import TRITON_IMPLEMENTATION


def is_tracing() -> bool:
    """True while torch.compile, torch.export or the TorchScript tracer capture a graph."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing()


@dataclass
class TokenMask:
    """Which positions hold real tokens (True) and which hold padding (False), shape (batch, n); `positions`, the
    tokens' position ids (batch or 1, n) where the model was given them (rotary positions read them)."""

    keep: Tensor
    positions: Tensor | None = None
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

    def token_positions(self) -> Tensor:
        """(batch or 1, n): the position ids, 0 .. n - 1 unless given."""
        if self.positions is not None:
            return self.positions
        return torch.arange(self.keep.shape[1], device=self.keep.device)[None]

    # the interface of PackedSequences, for mechanisms that take either: a padded batch is its own one block
    def per_block(self, compute: Callable[..., Tensor], *tensors: Tensor, grouped: bool = True) -> Tensor:
        return compute(*tensors, self)

    def convolve(self, conv: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        """conv (along the sequence axis of a (batch, n, channels) tensor) seeing zeros at the pad rows."""
        return conv(self.zero_pads(x))


# Sequences are grouped by length for the blocks: a new group starts where a sequence is shorter than this
# fraction of its group's longest, up to MAX_LENGTH_GROUPS groups (each costs a few more operator calls).
GROUP_LENGTH_RATIO = 0.7
MAX_LENGTH_GROUPS = 4


@dataclass
class SequenceBlocks:
    """Some sequences of a stream laid out one per row of a zero-padded (count, longest) block."""

    tokens: Tensor | None  # (tokens,) stream positions of their tokens, row by row; None: the whole stream in order
    slots: Tensor  # (tokens,) the row-major positions of those tokens in the block
    mask: TokenMask  # (count, longest)

    def gather(self, stream: Tensor) -> Tensor:
        """(total, ...) stream -> (count, longest, ...) block, zeros after each sequence."""
        rows = stream if self.tokens is None else stream.index_select(0, self.tokens)
        count, longest = self.mask.keep.shape
        block = stream.new_zeros(count * longest, *stream.shape[1:])
        return block.index_copy_(0, self.slots, rows).unflatten(0, (count, longest))

    def scatter(self, block: Tensor) -> Tensor:
        """(count, longest, ...) -> (tokens, ...): the real rows, in the order of `tokens`."""
        return block.flatten(0, 1).index_select(0, self.slots)


def sequence_blocks(lengths: Tensor, sequences: Tensor | None, cu_seqlens: Tensor) -> SequenceBlocks:
    """The blocks of `sequences` (indices into lengths, longest first; None: all, in order)."""
    chosen = lengths if sequences is None else lengths[sequences]
    positions = torch.arange(int(chosen.max()), device=lengths.device)
    keep = positions[None, :] < chosen[:, None]
    slots = keep.flatten().nonzero()[:, 0]
    tokens = None
    if sequences is not None:
        starts = cu_seqlens[:-1][sequences]
        tokens = (starts[:, None] + positions[None, :]).flatten()[slots]
    return SequenceBlocks(tokens, slots, TokenMask(keep))


@dataclass
class PackedSequences:
    """Sequences laid end to end in one row, (1, total, ...), with no padding: the padding-free layout.

    Token-wise layers (projections, feed-forward, layer norms) run on the stream as it is; what mixes positions
    (attention, convolutions) runs on blocks of zero-padded rows, one sequence per row (`per_block`), so that
    nothing reaches across a boundary. Sequences of similar lengths share a block, so that short ones do not pad
    to the longest. cu_seqlens: (batch + 1,) offsets of the sequences, as flash-attn's variable-length API."""

    cu_seqlens: Tensor
    max_seqlen: int
    positions: Tensor | None = None  # (1, total) position ids where the model was given them
    _groups: list[SequenceBlocks] | None = field(default=None, init=False, repr=False, compare=False)
    _one_block: SequenceBlocks | None = field(default=None, init=False, repr=False, compare=False)
    _offsets: Tensor | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_lengths(cls, lengths: Tensor) -> PackedSequences:
        return cls(F.pad(lengths.cumsum(0), (1, 0)), int(lengths.max()))

    @property
    def lengths(self) -> Tensor:
        return self.cu_seqlens[1:] - self.cu_seqlens[:-1]

    @property
    def offsets(self) -> Tensor:
        """cu_seqlens in int32, as variable-length kernels take them; made once for every layer (a cast is a launch
        on a GPU)."""
        if self._offsets is None:
            self._offsets = self.cu_seqlens.to(torch.int32)
        return self._offsets

    @property
    def starts(self) -> Tensor:
        """The stream index of each sequence's first token."""
        return self.cu_seqlens[:-1]

    def token_positions(self) -> Tensor:
        """(1, total): the position ids, 0, 1, ... within each sequence unless given."""
        if self.positions is not None:
            return self.positions
        return self.positions_in_sequences()

    def positions_in_sequences(self) -> Tensor:
        """(1, total): 0, 1, ... within each sequence."""
        starts = self.starts.repeat_interleave(self.lengths)
        return (torch.arange(starts.shape[0], device=starts.device) - starts)[None]

    @property
    def one_block(self) -> SequenceBlocks:
        """Every sequence in one (batch, longest) block, in order."""
        if self._one_block is None:
            self._one_block = sequence_blocks(self.lengths, None, self.cu_seqlens)
        return self._one_block

    @property
    def groups(self) -> list[SequenceBlocks]:
        """The blocks of sequences of similar length (GROUP_LENGTH_RATIO)."""
        if self._groups is None:
            lengths = self.lengths
            order = torch.argsort(lengths, descending=True, stable=True)
            ordered = lengths[order].tolist()
            bounds, longest = [0], ordered[0]
            for i, length in enumerate(ordered):
                if length < GROUP_LENGTH_RATIO * longest and len(bounds) < MAX_LENGTH_GROUPS:
                    bounds.append(i)
                    longest = length
            bounds.append(len(ordered))
            if len(bounds) == 2:
                self._groups = [self.one_block]
            else:
                self._groups = [sequence_blocks(lengths, order[first:end], self.cu_seqlens)
                                for first, end in itertools.pairwise(bounds)]
        return self._groups

    def per_block(self, compute: Callable[..., Tensor], *tensors: Tensor, grouped: bool = True) -> Tensor:
        """compute(*blocks, block_mask) on the (count, longest, ...) blocks of the streams `tensors` (1, total, ...),
        its (count, longest, ...) result put back into a stream (1, total, ...). grouped=False: one block of all the
        sequences in order (for attention maps of the whole batch)."""
        groups = self.groups if grouped else [self.one_block]
        # flatten(0, 1), a view, drops the stream's batch axis of 1 (x[0] would copy in backward)
        pieces = [(group, group.scatter(compute(*(group.gather(x.flatten(0, 1)) for x in tensors), group.mask)))
                  for group in groups]
        if len(pieces) == 1 and pieces[0][0].tokens is None:
            return pieces[0][1][None]
        out = pieces[0][1].new_empty(self.cu_seqlens[-1], *pieces[0][1].shape[1:])
        for group, rows in pieces:
            out.index_copy_(0, group.tokens, rows)
        return out[None]

    def zero_pads(self, x: Tensor) -> Tensor:
        return x  # a stream has no pads

    def convolve(self, conv: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        """conv along each sequence of the stream x, seeing zeros beyond the sequence's ends."""
        return self.per_block(lambda block, mask: conv(block), x)


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
    if attn_implementation in ("sdpa", "flex_attention", TRITON_IMPLEMENTATION) and not need_weights:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
        return out, None
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias
    probs = scores.softmax(dim=-1)
    out = torch.matmul(F.dropout(probs, dropout_p), v)
    return out, probs
