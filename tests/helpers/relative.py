"""Shared by the relative-attention path tests: the term combinations, a randomised layer, a padded batch,
and a layer's outputs with the gradients of a fixed random projection of them."""

from __future__ import annotations

import torch

from convattn import ConvAttnConfig
from convattn.attention.composite import CompositeSelfAttention
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


def batch(lengths, n, dtype, seed=0, width=32):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), n, width, generator=generator).to(dtype).requires_grad_()
    keep = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return x, keep


def output_and_grads(layer, x, keep, forward):
    out = forward(x, keep)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    loss = (out.double() * weights * keep[..., None]).sum()  # pad rows' outputs are unused downstream
    grads = torch.autograd.grad(loss, [x, *layer.parameters()])
    return out.double(), [g.double() for g in grads]
