"""Where a batch's sequences are, read off what a user passes, and every such input checked on the way in.

A batch is padded (batch, n), each row one sequence of its real tokens (attention_mask), or flattened:
transformers' `DataCollatorWithFlattening` layout, one row (1, total) holding several sequences end to end, told by
position_ids restarting at 0 and, optionally, flash-attn's kwargs cu_seq_lens_q / cu_seq_lens_k (offsets) and
max_length_q / max_length_k (the longest length). The rule (`flattened_sequences`) is transformers' own on every
input it accepts; anything else is refused with a ValueError naming the field, never read some other way.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor

from convattn.attention import PackedSequences


def shape_text(batch: int, n: int) -> str:
    return f"({batch}, {n})" if batch == 1 else f"({batch}, {n}) or (1, {n})"


def fits_rows(x: Tensor, batch: int, n: int, one_dimensional: bool) -> bool:
    """Whether x has the shape (batch, n), or (1, n) or, where `one_dimensional`, (n,) for every row alike.
    Dimension by dimension: under torch.compile the sizes may be symbols, which tuples would not compare."""
    if x.dim() == 1:
        return one_dimensional and x.shape[0] == n
    return x.dim() == 2 and x.shape[1] == n and (x.shape[0] == batch or x.shape[0] == 1)


def check_ids(name: str, ids: Tensor | None, batch: int, n: int) -> None:
    """Per-token ids: the input's shape, (1, n) or (n,) for every row alike (as the embeddings broadcast them);
    integers."""
    if ids is None:
        return
    if not fits_rows(ids, batch, n, one_dimensional=True):
        raise ValueError(f"{name} must have the input's shape {shape_text(batch, n)}; got {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers; got {ids.dtype}")


def integer_length(name: str, value) -> int:
    if torch.is_tensor(value):
        if value.numel() != 1 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise ValueError(f"{name} must be one integer; got a {value.dtype} tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be one integer; got {value!r}")
    return value


def check_flash_kwargs_agree(cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k) -> None:
    """flash-attn's kwargs come as transformers passes them: the _k twins equal the _q ones (an encoder's keys are
    its queries) and max_length_q only with the offsets it describes."""
    if cu_seq_lens_k is not None and (cu_seq_lens_q is None or not torch.equal(
            torch.as_tensor(cu_seq_lens_k).long().cpu(), torch.as_tensor(cu_seq_lens_q).long().cpu())):
        raise ValueError("cu_seq_lens_k must equal cu_seq_lens_q: an encoder's keys are its queries")
    if max_length_q is not None:
        if cu_seq_lens_q is None:
            raise ValueError("max_length_q describes the offsets cu_seq_lens_q of a flattened batch and comes with "
                             "them; got max_length_q without cu_seq_lens_q")
        integer_length("max_length_q", max_length_q)
    if max_length_k is not None and (max_length_q is None or integer_length("max_length_k", max_length_k)
                                     != integer_length("max_length_q", max_length_q)):
        raise ValueError("max_length_k must equal max_length_q: an encoder's keys are its queries")


def sequence_starts(positions: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """(batch, n) bools: where a sequence starts, and where a position breaks the rule of `flattened_sequences`.
    A token's predecessor is the previous real token of its row; pads (keep False) start nothing and break
    nothing."""
    index = torch.arange(positions.shape[1], device=positions.device)
    last_real = torch.where(keep, index, -1).cummax(1).values
    predecessor = F.pad(last_real[:, :-1], (1, 0), value=-1)
    follows = (predecessor >= 0) & (positions == positions.gather(1, predecessor.clamp(min=0)) + 1)
    starts = keep & ~follows & ((predecessor < 0) | (positions == 0))
    return starts, keep & ~follows & ~starts


def first_broken_position(positions: Tensor, keep: Tensor, broken: Tensor) -> str:
    row, token = broken.nonzero()[0].tolist()
    before = positions[row, :token][keep[row, :token]][-1].item()
    return f"token {token} of row {row} has position {positions[row, token].item()} after {before}"


def flattened_sequences(
    batch: int,
    n: int,
    device: torch.device,
    position_ids: Tensor | None = None,
    attention_mask: Tensor | None = None,
    token_type_ids: Tensor | None = None,
    cu_seq_lens_q: Tensor | None = None,
    cu_seq_lens_k: Tensor | None = None,
    max_length_q: int | Tensor | None = None,
    max_length_k: int | Tensor | None = None,
    max_position: int | None = None,
) -> PackedSequences | None:
    """The sequences of a flattened batch; None for a padded one (each row one sequence). Every input that says
    where tokens or sequences are is checked here, once per forward; a ValueError names the field otherwise.

    position_ids split each row into sequences: the row's first real token starts one at any position p >= 0;
    every next real token (pads are skipped) either follows its predecessor (its position + 1, the same sequence)
    or has position 0 and starts a new one. Any other position (repeated, decreasing to anything but 0, jumping
    up) is refused, as are negative positions and, where `max_position` is set (absolute position embeddings),
    positions from max_position on. A row holding several sequences is a flattened batch: it must be the batch's
    only row and hold no padding. On rows that begin at position 0 this is transformers' rule, both its flash
    path's (a sequence starts where position_ids == 0, their minimum) and its masks' (where a position does not
    follow its predecessor), which agree on every row accepted here; a row beginning at p > 0 is read as its masks
    read it. Sequences restarting at another position (DataCollatorWithFlattening's position_ids_start) are
    refused: convattn's positions count from 0.

    cu_seq_lens_q (integers rising from 0 to n, a batch of one row) gives the sequences' offsets explicitly; its
    twin cu_seq_lens_k must equal it, max_length_q (and max_length_k) must be the longest length, and position_ids,
    when they come too, must start sequences exactly there.

    Under torch.export and the TorchScript tracer, which cannot branch on the data, only shapes and dtypes are
    checked and the batch is read as padded; torch.compile breaks the graph here when position_ids or offsets
    come."""
    check_ids("position_ids", position_ids, batch, n)
    check_ids("token_type_ids", token_type_ids, batch, n)
    if attention_mask is not None and not fits_rows(attention_mask, batch, n, one_dimensional=False):
        raise ValueError(f"attention_mask must have the input's shape {shape_text(batch, n)} (1 at real tokens, 0 "
                         f"at padding); got {tuple(attention_mask.shape)}")
    check_flash_kwargs_agree(cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k)
    if cu_seq_lens_q is None and position_ids is None:
        return None
    if cu_seq_lens_q is None and (torch.compiler.is_exporting() or torch.jit.is_tracing()):
        return None
    keep = torch.ones(batch, n, dtype=torch.bool, device=device)
    if attention_mask is not None:
        keep = attention_mask.to(device).bool().expand(batch, n)
    offsets = None if cu_seq_lens_q is None else checked_offsets(cu_seq_lens_q, batch, n)
    if position_ids is None:
        if not bool(keep.all()):
            raise ValueError("a flattened batch has no padding: its attention_mask must be all ones or None")
        return packed_from_offsets(offsets, max_length_q, device)
    positions = position_ids.reshape(-1, n).expand(batch, n).to(device)
    starts, broken = sequence_starts(positions, keep)
    offset_starts = starts[0]
    if offsets is not None:
        offset_starts = torch.zeros_like(starts[0]).index_fill_(0, torch.tensor(offsets[:-1], device=device), True)
    facts = [broken.any(), (starts.sum(1) > 1).any(), ~keep.all(), positions.min(), positions.max(),
             (starts[0] != offset_starts).any()]
    any_broken, restarts, padded, lowest, highest, disagree = torch.stack([f.long() for f in facts]).tolist()
    if any_broken:
        raise ValueError("position_ids must rise by 1 within a sequence and restart at 0 to begin the next one; "
                         + first_broken_position(positions, keep, broken))
    if lowest < 0:
        raise ValueError(f"position_ids must be >= 0; got {lowest}")
    if max_position is not None and highest >= max_position:
        raise ValueError(f"position_ids must be < max_position_embeddings={max_position} of this model's absolute "
                         f"position embeddings; got {highest}")
    if restarts and batch > 1:
        raise ValueError(f"position_ids restart at 0 inside a row of a batch of {batch} rows: a flattened batch is "
                         "one row (1, total); pass several rows padded, each one sequence, with an attention_mask")
    if (restarts or offsets is not None) and padded:
        raise ValueError("a flattened batch has no padding: its attention_mask must be all ones or None")
    if disagree:
        from_positions = starts[0].nonzero()[:, 0].tolist()
        raise ValueError(f"cu_seq_lens_q and position_ids disagree on where sequences start: cu_seq_lens_q at "
                         f"{offsets[:-1]}, position_ids (restarting at 0) at {from_positions}")
    if offsets is None and not restarts:
        return None
    if offsets is None:
        offsets = [*starts[0].nonzero()[:, 0].tolist(), n]
    return packed_from_offsets(offsets, max_length_q, device)


def checked_offsets(cu_seq_lens_q: Tensor | list, batch: int, n: int) -> list[int]:
    """cu_seq_lens_q as a list, refused unless its integers rise from 0 to n in a batch of one row."""
    offsets = torch.as_tensor(cu_seq_lens_q).flatten()
    if offsets.is_floating_point() or offsets.is_complex() or offsets.dtype == torch.bool:
        raise ValueError(f"cu_seq_lens_q must hold integer offsets (int32 or int64); got {offsets.dtype}")
    values = offsets.tolist()
    rising = all(b > a for a, b in itertools.pairwise(values))
    if batch != 1 or len(values) < 2 or values[0] != 0 or values[-1] != n or not rising:
        raise ValueError(f"cu_seq_lens_q must rise from 0 to the flattened row's {n} tokens in a batch of one "
                         f"row; got {values} for a batch of shape ({batch}, {n})")
    return values


def packed_from_offsets(offsets: list[int], max_length_q: int | Tensor | None, device: torch.device) -> PackedSequences:
    longest = max(b - a for a, b in itertools.pairwise(offsets))
    if max_length_q is not None and integer_length("max_length_q", max_length_q) != longest:
        raise ValueError(f"max_length_q must be the longest sequence's length, {longest} here; "
                         f"got {integer_length('max_length_q', max_length_q)}")
    return PackedSequences(torch.tensor(offsets, device=device), longest)
