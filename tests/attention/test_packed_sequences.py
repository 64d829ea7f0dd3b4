"""PackedSequences: sequences end to end in one stream, computed per sequence on zero-padded blocks."""

from __future__ import annotations

import torch

from convattn.attention import PackedSequences, TokenMask


def along_each_sequence(block: torch.Tensor, mask: TokenMask) -> torch.Tensor:
    """A function that sees whole sequences: the running sum from each sequence's start, and its length."""
    return torch.cat([block.cumsum(1), mask.keep.sum(1)[:, None, None].expand(-1, block.shape[1], 1)], dim=-1)


def test_blocks_group_sequences_of_similar_length_and_give_back_the_stream_in_order():
    lengths = torch.tensor([3, 40, 1, 38, 12, 20, 39, 2])
    packed = PackedSequences.from_lengths(lengths)
    assert packed.cu_seqlens.tolist() == [0, 3, 43, 44, 82, 94, 114, 153, 155] and packed.max_seqlen == 40
    shapes = [tuple(group.mask.keep.shape) for group in packed.groups]
    assert shapes[0] == (3, 40) and len(shapes) > 1  # the three long ones together, the short ones apart
    assert sum(shape[0] for shape in shapes) == len(lengths)
    stream = torch.randn(1, int(lengths.sum()), 2, dtype=torch.float64, requires_grad=True)
    grouped = packed.per_block(along_each_sequence, stream)
    one_block = packed.per_block(along_each_sequence, stream, grouped=False)
    expected = torch.cat(
        [
            along_each_sequence(piece[None], TokenMask(torch.ones(1, len(piece), dtype=torch.bool)))[0]
            for piece in stream[0].split(lengths.tolist())
        ]
    )
    torch.testing.assert_close(grouped[0], expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(one_block[0], expected, rtol=0, atol=1e-12)
    weights = torch.randn_like(grouped)
    (grad_grouped,) = torch.autograd.grad((grouped * weights).sum(), stream)
    (grad_one,) = torch.autograd.grad((one_block * weights).sum(), stream)
    torch.testing.assert_close(grad_grouped, grad_one, rtol=0, atol=1e-12)


def test_convolutions_see_zeros_beyond_each_sequence():
    lengths = torch.tensor([4, 2, 5])
    packed = PackedSequences.from_lengths(lengths)
    stream = torch.arange(1.0, 12.0)[None, :, None]

    def neighbours(x: torch.Tensor) -> torch.Tensor:  # x[i - 1] + x[i + 1], zeros outside
        padded = torch.nn.functional.pad(x, (0, 0, 1, 1))
        return padded[:, :-2] + padded[:, 2:]

    out = packed.convolve(neighbours, stream)[0, :, 0]
    assert out.tolist() == [2, 4, 6, 3, 6, 5, 8, 16, 18, 20, 10]


def test_a_padded_batch_is_its_own_block():
    mask = TokenMask(torch.tensor([[True, True, False]]))
    x = torch.ones(1, 3, 2)
    assert mask.per_block(lambda block, block_mask: block * 2 if block_mask is mask else None, x).sum() == 12
    assert mask.convolve(lambda block: block, x)[0, 2].abs().sum() == 0  # pad rows zeroed first
