"""The fused attention kernels that compute decomposition.py's far parts, one per device.

Each is softmax(q k^T * scale [+ key_mask]) v over (batch, heads, m, d) operands, optionally causal (query a
sees keys b <= a, on square operands) and with dropout on the probabilities, returning the output, the
log-sum-exp of every query row (float32, or float64 for float64 inputs) and the state its backward needs
to replay the same dropout masks, a tuple of `state_size` tensors. Its backward takes the output and
log-sum-exp it is given, not the ones it returned: decomposition.py feeds it the merged ones.

`tiling` says how decomposition.py cuts the far parts for the kernel: "causal" where the kernel skips the
blocks its causal mask hides, so each far part is one shifted causal call that costs half a full attention;
"blocks" where it does not (the CPU kernel tiles keys by 512 and computes the whole tile), so the far parts
are rectangles whose queries all see all their keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

aten = torch.ops.aten


class CpuFlashKernel:
    """torch's fused CPU flash-attention kernel: any head size, an additive key mask, no dropout. A causal call
    of 503 queries at n = 512 cost as much as a full one, at 2,048 0.6x (2 threads), hence "blocks"."""

    takes_key_mask = True
    tiling = "blocks"
    state_size = 0

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, key_mask: Tensor | None, causal: bool, dropout_p: float,
                scale: float):
        if dropout_p:
            raise ValueError("the CPU flash kernel has no dropout; relative terms with dropout run blockwise on CPU")
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=causal, attn_mask=key_mask,
                                                                   scale=scale)
        return out, lse, ()

    def backward(self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, state, *,
                 key_mask: Tensor | None, causal: bool, dropout_p: float, scale: float):
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, causal, attn_mask=key_mask, scale=scale)


def _pad_head(x: Tensor, width: int) -> Tensor:
    """Zero channels up to `width`, rows contiguous (the kernels load rows in aligned 16-byte vectors)."""
    return (F.pad(x, (0, width - x.shape[-1])) if x.shape[-1] != width else x).contiguous()


class CudaFlashKernel:
    """torch's CUDA flash-attention kernel for float16 / bfloat16 and its memory-efficient kernel for float32,
    both with dropout (their Philox state replays the masks in backward) and causal block skipping. They
    take no key mask: decomposition.py puts pads on a key column. Heads are zero-padded to a multiple of 8
    channels, which the kernels need."""

    takes_key_mask = False
    tiling = "causal"
    state_size = 2  # the Philox seed and offset

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, key_mask: Tensor | None, causal: bool, dropout_p: float,
                scale: float):
        d, m = q.shape[-1], q.shape[-2]
        width = -(-d // 8) * 8
        q, k, v = (_pad_head(x, width) for x in (q, k, v))
        if q.dtype in (torch.float16, torch.bfloat16):
            out, lse, _, _, _, _, seed, offset, _ = aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, causal, False, scale=scale)
            return out[..., :d], lse, (seed, offset)
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, dropout_p, causal, scale=scale)
        return out[..., :d], lse[..., :m], (seed, offset)

    def backward(self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, state, *,
                 key_mask: Tensor | None, causal: bool, dropout_p: float, scale: float):
        d = q.shape[-1]
        width = -(-d // 8) * 8
        grad_out, q, k, v, out = (_pad_head(x, width) for x in (grad_out, q, k, v, out))
        seed, offset = state
        if q.dtype in (torch.float16, torch.bfloat16):
            grads = aten._scaled_dot_product_flash_attention_backward(
                grad_out, q, k, v, out, lse.contiguous(), None, None, q.shape[-2], k.shape[-2], dropout_p, causal,
                seed, offset, scale=scale)
        else:
            # backward takes the log-sum-exp in the forward's shape: padded to a multiple of 32 queries (not on ROCm)
            m = lse.shape[-1]
            padded = lse.new_zeros(*lse.shape[:-1], m if torch.version.hip else -(-m // 32) * 32)
            padded[..., :m] = lse
            grads = aten._scaled_dot_product_efficient_attention_backward(
                grad_out, q, k, v, None, out, padded, seed, offset, dropout_p, [True, True, True, False], causal,
                scale=scale)[:3]
        return tuple(g[..., :d] for g in grads)


CPU_FLASH = CpuFlashKernel()
CUDA_FLASH = CudaFlashKernel()


def fused_kernel(device: torch.device, dtype: torch.dtype):
    """The kernel for operands on `device` of `dtype`, or None where no fused kernel serves them (float64 and
    other devices on a GPU machine, any device but CPU and CUDA)."""
    if device.type == "cpu":
        return CPU_FLASH
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16, torch.float32):
        return CUDA_FLASH
    return None
