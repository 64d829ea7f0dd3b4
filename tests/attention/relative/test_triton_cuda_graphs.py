"""The fused kernel inside a step that torch.compile's inductor compiles and replays as CUDA graphs
(mode="reduce-overhead", what `--compile-mode reduce-overhead` trains with): no part of the step is left out of
the graphs, the results are eager mode's, and each replay draws a new dropout mask from torch's generator, which
a reseeded generator reproduces. GPU only (the interpreter has neither inductor's Triton launches nor graphs)."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny import randomize_
from torch._dynamo.utils import counters

from convattn.attention.relative.bias import RelativePositionBias
from convattn.attention.relative.triton_attention import triton_relative_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs of the kernel need a GPU")
BATCH, HEADS, N, HEAD_DIM, REACH = 2, 4, 256, 64, 8


@pytest.fixture(autouse=True)
def fresh_compiler():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def composite_key_bias() -> RelativePositionBias:
    """A composite+key bias (both tables) with random parameters."""
    rel = RelativePositionBias(("fixed", "dynamic_query", "dynamic_key"), HEADS, HEAD_DIM, REACH, "clip")
    randomize_(rel)
    return rel.cuda()


def attention(rel: RelativePositionBias, dropout_p: float):
    """(q, k, v) -> the kernel's output with both of `rel`'s tables, the second row padded."""
    keep = (torch.arange(N)[None, :] < torch.tensor([N, N - 55])[:, None]).cuda()

    def attend(q, k, v):
        row_table, key_table = (t.to(q.dtype) for t in rel.tables(q, k))
        return triton_relative_attention(q, k, v, row_table, key_table, reach=REACH, clip=True, keep=keep,
                                         dropout_p=dropout_p)

    return attend


def step(attend, rel, weights, q, k, v) -> list[torch.Tensor]:
    """Forward and backward: the output and the gradients of q, k, v and the tables' parameters, copied out of
    the graphs' memory (the next replay writes over it)."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    torch.compiler.cudagraph_mark_step_begin()
    out = attend(q, k, v)
    grads = torch.autograd.grad((out.float() * weights).sum(), [q, k, v, *rel.parameters()])
    return [x.detach().clone() for x in (out, *grads)]


def operands() -> tuple[list[torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(BATCH, HEADS, N, HEAD_DIM, generator=generator).cuda().bfloat16() for _ in range(3))
    return [q, k, v], torch.randn(BATCH, HEADS, N, HEAD_DIM, generator=generator).cuda()


def relative_error(ours: torch.Tensor, expected: torch.Tensor) -> float:
    return ((ours.double() - expected.double()).norm() / expected.double().norm().clamp_min(1.0)).item()


def test_the_step_replays_as_cuda_graphs_and_computes_what_eager_does():
    rel = composite_key_bias()
    attend = attention(rel, 0.0)
    (q, k, v), weights = operands()
    eager = step(attend, rel, weights, q, k, v)
    compiled = torch.compile(attend, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # a warm-up run, the recording, a replay
        for ours, expected in zip(step(compiled, rel, weights, q, k, v), eager, strict=True):
            assert relative_error(ours, expected) < 1e-2
    assert counters["inductor"]["cudagraph_skips"] == 0


def test_each_replay_draws_a_new_dropout_mask_and_a_reseeded_generator_the_same():
    rel = composite_key_bias()
    (q, k, v), weights = operands()
    compiled = torch.compile(attention(rel, 0.1), mode="reduce-overhead", fullgraph=True)
    for _ in range(2):  # past the warm-up run and the recording: what follows replays
        step(compiled, rel, weights, q, k, v)
    torch.manual_seed(7)
    first = step(compiled, rel, weights, q, k, v)
    following = step(compiled, rel, weights, q, k, v)
    torch.manual_seed(7)
    again = step(compiled, rel, weights, q, k, v)
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert not torch.equal(first[0], following[0])
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    no_dropout = step(attention(rel, 0.0), rel, weights, q, k, v)[0]
    assert relative_error(first[0], no_dropout) < 0.5  # a mask that drops about 1 in 10, kept values scaled up
