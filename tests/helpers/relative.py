"""Shared by the relative-attention path tests: the term combinations, randomised composite and ConvBERT layers,
a padded batch, a layer's outputs with the gradients of a fixed random projection of them, and an explicit
stand-in for the fused kernels with dropout."""

from __future__ import annotations

import torch
from torch import Tensor

from convattn import ConvAttnConfig
from convattn.attention import TokenMask
from convattn.attention.composite import CompositeSelfAttention
from convattn.attention.convbert import ConvBertMixedAttention
from helpers.tiny import randomize_

TERMS = {
    "fixed": ["fixed"],
    "dynamic": ["dynamic_query"],
    "key": ["dynamic_key"],
    "composite": ["fixed", "dynamic_query"],
    "composite+key": ["fixed", "dynamic_query", "dynamic_key"],
}


def make_layer(terms, out_of_window="clip", reach=3, dtype=torch.float32, hidden_size=32, **fields):
    config = ConvAttnConfig(hidden_size=hidden_size, num_attention_heads=4, relative_terms=terms, relative_reach=reach,
                            relative_out_of_window=out_of_window, attention_probs_dropout_prob=0.0, **fields)
    layer = CompositeSelfAttention(config).to(dtype).train()
    randomize_(layer)
    return layer


def make_convbert_layer(terms, out_of_window="clip", reach=3, dtype=torch.float32, hidden_size=32, **fields):
    """ConvBERT mixed attention with 2 self-attention heads of hidden_size / 4 channels carrying the terms."""
    config = ConvAttnConfig(hidden_size=hidden_size, num_attention_heads=4, head_ratio=2, conv_kernel_size=5,
                            relative_terms=terms, relative_reach=reach, relative_out_of_window=out_of_window,
                            attention_probs_dropout_prob=0.0, **fields)
    layer = ConvBertMixedAttention(config).to(dtype).train()
    randomize_(layer)
    return layer


def batch(lengths, n, dtype, seed=0, width=32):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), n, width, generator=generator).to(dtype).requires_grad_()
    keep = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return x, keep


def gradient_weights(out: Tensor) -> Tensor:
    """The fixed random projection of an output whose gradients are compared."""
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def output_and_grads(layer, x, keep, forward):
    out = forward(x, keep)
    loss = (out.double() * gradient_weights(out) * keep[..., None]).sum()  # pad rows' outputs are unused downstream
    grads = torch.autograd.grad(loss, [x, *layer.parameters()])
    return out.double(), [g.double() for g in grads]


# the float64 loop references' outputs and gradients, by what they were computed from (`kept_output_and_grads`)
REFERENCES: dict[tuple, tuple[Tensor, list[Tensor]]] = {}


def kept_output_and_grads(case: tuple, layer, x, keep, reference):
    """`output_and_grads` of a loop reference (seconds each), computed once for `case` (what built the layer and the
    batch) and the reference, the layer's weights and the inputs as they are now: tests that run one layer on several
    paths, or tile it differently, share it."""
    key = (getattr(reference, "func", reference).__name__, *case, float(x.detach().double().sum()),
           tuple(keep.sum(-1).tolist()), tuple(float(p.detach().double().sum()) for p in layer.parameters()))
    if key not in REFERENCES:
        REFERENCES[key] = output_and_grads(layer, x, keep, reference)
    return REFERENCES[key]


class MathKernel:
    """The interface of attention/relative/kernels.py computed explicitly, with dropout: as the CUDA kernels,
    no key mask (pads ride on the key column), "causal" tiling, and dropout masks drawn from a seed that
    forward takes from torch's global generator and backward replays (the CUDA kernels' Philox state)."""

    takes_key_mask = False

    def __init__(self, tiling: str = "causal"):
        self.tiling = tiling

    @staticmethod
    def _scores(q: Tensor, k: Tensor, key_mask, causal: bool, scale: float) -> Tensor:
        """Scores in float32 for half-precision inputs (as the fused kernels accumulate), else their dtype."""
        assert key_mask is None
        acc = torch.promote_types(q.dtype, torch.float32)
        scores = q.to(acc) @ k.to(acc).mT * scale
        if causal:
            hidden = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
            scores = scores.masked_fill(hidden, float("-inf"))
        return scores

    @staticmethod
    def _keep(shape, seed: int, dropout_p: float, dtype) -> Tensor:
        if not dropout_p:
            return torch.ones(shape, dtype=dtype)
        uniform = torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return (uniform >= dropout_p).to(dtype) / (1 - dropout_p)

    def forward(self, q, k, v, *, key_mask, causal, dropout_p, scale):
        scores = self._scores(q, k, key_mask, causal, scale)
        lse = scores.logsumexp(-1)
        seed = int(torch.randint(2**62, ()))
        probs = torch.exp(scores - lse[..., None]) * self._keep(scores.shape, seed, dropout_p, scores.dtype)
        return (probs @ v.to(probs.dtype)).to(q.dtype), lse, seed

    def backward(self, grad_out, q, k, v, out, lse, seed, *, key_mask, causal, dropout_p, scale):
        scores = self._scores(q, k, key_mask, causal, scale)
        acc, dtype = scores.dtype, q.dtype
        probs = torch.exp(scores - lse[..., None])  # the log-sum-exp it is given, not its own
        keep = self._keep(scores.shape, seed, dropout_p, acc)
        grad_out, q, k, v, out = (t.to(acc) for t in (grad_out, q, k, v, out))
        grad_scores = probs * ((grad_out @ v.mT) * keep - (grad_out * out).sum(-1, keepdim=True))
        grads = grad_scores @ k * scale, grad_scores.mT @ q * scale, (probs * keep).mT @ grad_out
        return tuple(g.to(dtype) for g in grads)


def directional_derivatives(layer, x, keep, dropout_p, seed=7, eps=1e-6):
    """(d/dh f(params + h u), its central difference) for f = <out, w> under a fixed seed, u random: equal only
    if backward replays the forward's dropout masks."""
    layer.dropout_p = dropout_p
    params = [x, *layer.parameters()]
    generator = torch.Generator().manual_seed(3)
    directions = [torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) for p in params]
    width = layer(x, TokenMask(keep))[0].shape[-1]
    weights = torch.randn(*x.shape[:2], width, generator=generator, dtype=x.dtype).to(x.device) * keep[..., None]

    def f():
        torch.manual_seed(seed)
        return (layer(x, TokenMask(keep))[0] * weights).sum()

    grads = torch.autograd.grad(f(), params)
    analytic = sum((g * u).sum() for g, u in zip(grads, directions, strict=True)).item()
    values = []
    with torch.no_grad():
        for sign in (1, -1):
            for p, u in zip(params, directions, strict=True):
                p += sign * eps * u
            values.append(f().item())
            for p, u in zip(params, directions, strict=True):
                p -= sign * eps * u
    return analytic, (values[0] - values[1]) / (2 * eps), f().item()
