"""What every attention mechanism shares: the padding mask and softmax attention itself."""

from __future__ import annotations

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
