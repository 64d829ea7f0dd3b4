"""Padding-free routing: which padded batches run on their real tokens only, and how.

A padded batch with enough padding runs, in training, packed into one stream of its real tokens (`unpadded`),
each row a sequence of the stream (the layout a flattened batch has, `flattened_inputs`), and comes back padded.
The heads of a flattened batch read its sequences as the encoder read them (`flattened`).
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.modeling_outputs import BaseModelOutput

from convattn.attention import PackedSequences
from convattn.attention.core import is_tracing
from convattn.flattened_inputs import flattened_sequences

# On these devices, a padded batch whose real tokens fill less than this fraction of it runs padding-free: its real
# tokens packed into one stream, attention and convolutions per sequence of similar lengths. 0.9: on CPU masked-LM
# steps of (32, 128) batches still ran faster padding-free at 90 % real tokens
# (`python benchmarks/padding_free.py --sweep` measures it again). Not measured on CUDA, where flattened batches
# (which take the fused kernel's cu_seqlens interface) are the way to skip padding.
UNPAD_BELOW_REAL_FRACTION = {"cpu": 0.9}


def worth_unpadding(model, keep: Tensor) -> bool:
    """Whether `model` (a ConvAttnModel) runs this padded batch padding-free: in training (a training step only
    reads the real positions' outputs, while evaluation and inference give back every position's, pads included,
    exactly as before), with enough padding on a device where that measured faster (UNPAD_BELOW_REAL_FRACTION),
    the same outputs at the real positions (`unpadding_keeps_outputs`), and no graph being traced (torch.compile,
    export), which cannot branch on the data."""
    if not model.training or is_tracing() or keep.device.type not in UNPAD_BELOW_REAL_FRACTION:
        return False
    mostly_padding = bool(keep.sum() < UNPAD_BELOW_REAL_FRACTION[keep.device.type] * keep.numel())
    return mostly_padding and unpadding_keeps_outputs(model, keep)


def unpadding_keeps_outputs(model, keep: Tensor) -> bool:
    """Whether running this padded batch padding-free gives its real positions today's outputs: every row is
    right-padded (its real tokens first, so that relative offsets, convolution neighbours and the position
    the classification head reads stay where they were), and ConvBERT does not let pads into its convolution
    (convbert_padding="reference"). The pad positions' outputs are zeros instead; heads that read them (the
    span QA head's softmax runs over every position) turn the model's `runs_padding_free` off."""
    if not (model.runs_padding_free and model.takes_packed_sequences):
        return False
    if model.config.uses_convbert and model.config.convbert_padding != "masked":
        return False
    lengths = keep.sum(1, keepdim=True)
    right_padded = keep == (torch.arange(keep.shape[1], device=keep.device) < lengths)
    return bool(right_padded.all() and (lengths > 0).all())


def positions_in_sequences(packed: PackedSequences, total: int, device: torch.device) -> Tensor:
    """(1, total): 0, 1, ... within each sequence of a stream."""
    starts = packed.starts.repeat_interleave(packed.lengths)
    return (torch.arange(total, device=device) - starts.to(device))[None]


def unpadded(model, keep: Tensor, input_ids, token_type_ids, position_ids, inputs_embeds,
             output_hidden_states: bool) -> BaseModelOutput:
    """The padded batch computed by `model` (a ConvAttnModel) on its real tokens only, packed into one stream
    (1, total, H); the hidden states come back padded (batch, n, H), zeros at the pad positions."""
    batch, n = keep.shape
    packed = PackedSequences.from_lengths(keep.sum(1))
    token_index = keep.flatten().nonzero()[:, 0]

    def real_tokens(x: Tensor | None) -> Tensor | None:
        return None if x is None else x.expand(batch, n, *x.shape[2:]).flatten(0, 1)[token_index][None]

    if position_ids is None:
        position_ids = torch.arange(n, device=keep.device)[None]  # the positions a padded row would have
    packed.positions = real_tokens(position_ids)
    hidden = model.embed(real_tokens(input_ids), real_tokens(token_type_ids), packed.positions,
                         real_tokens(inputs_embeds))
    encoded = model.encoder(hidden, packed, False, output_hidden_states)

    def padded(stream: Tensor) -> Tensor:
        rows = stream.new_zeros(batch * n, stream.shape[-1])
        return rows.index_copy_(0, token_index, stream.flatten(0, 1)).view(batch, n, -1)

    return BaseModelOutput(
        last_hidden_state=padded(encoded.last_hidden_state),
        hidden_states=tuple(padded(h) for h in encoded.hidden_states) if output_hidden_states else None,
    )


def flattened(model, hidden: Tensor, position_ids, attention_mask, sequence_offsets: dict) -> PackedSequences | None:
    """The sequences of a flattened batch as the encoder of `model` (a task head's model) read them (and checked),
    for heads that need them; None for a padded batch."""
    return flattened_sequences(*hidden.shape[:2], hidden.device, position_ids, attention_mask, **sequence_offsets,
                               max_position=model.convattn.max_position)
