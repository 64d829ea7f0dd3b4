"""The GPU call's gate (issue 62), its first stage: before anything is timed, the fused kernel against SDPA and a
float64 reference at one small shape, the output and every gradient, at each tiling the autotuners may pick
(kernel_tilings.pinned_tiling) and in each dQ design. A failure marks every kernel and training row of the call
"unverified" (they are still measured); so does a gate that did not finish.

  plain          no terms, no mask: against SDPA (its flash kernel on a GPU) and float64
  composite+key  both tables (fixed + dynamic_query, dynamic_key) as a layer sends them (dispatch.kernel_inputs:
                 projected inside the kernel's launches, their share of dq and dk summed by its backward), 1/8 of
                 one row padded: against float64, the bias built densely by bias.py in float64

Each error is ||x - ref|| / ||ref|| of the output, and of the gradients of a random weighted sum of it with respect
to q, k, v and each table parameter; it passes at most TOLERANCE for the dtype (bf16 operands land between 1e-3 and
1e-2; NaN never passes). The plain case records SDPA's own errors beside. A deterministic design's backward, run
twice on the same inputs, must give the same bits (a race in the dQ accumulators' read-add-write shows here first).
Every buffer the kernel's launches allocate starts as NaN (`poisoned_allocations`), so an element no program writes
fails: on a GPU the caching allocator hands each tiling the memory the one before filled with right values.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from unittest import mock

TOLERANCE = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 1e-4}
CASES = ("plain", "composite+key")


def relative_error(ours, expected) -> float:
    import torch

    ours, expected = ours.double(), expected.double()
    if not torch.isfinite(ours).all():
        return math.inf
    return ((ours - expected).norm() / expected.norm().clamp_min(1e-12)).item()


def reference(q, k, v, rel, keep):
    """softmax(q k^T / sqrt(d) + bias, real keys only) v in float64."""
    scores = q @ k.mT / math.sqrt(q.shape[-1])
    if rel is not None:
        scores = scores + rel(q, k)
    if keep is not None:
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    return scores.softmax(-1) @ v


def problem(case: str, batch: int, heads: int, n: int, head_dim: int, device: str):
    """float64 q, k, v, a float32 RelativePositionBias (None for plain) with random parameters, and the key mask."""
    import torch

    from convattn import ConvAttnConfig
    from convattn.attention.relative import RelativePositionBias

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, generator=generator, dtype=torch.float64).to(device)
               for _ in range(3))
    if case == "plain":
        return (q, k, v), None, None
    config = ConvAttnConfig.from_preset("chang2021-small/composite+key")
    rel = RelativePositionBias(["fixed", "dynamic_query", "dynamic_key"], heads, head_dim, config.relative_reach,
                               config.relative_out_of_window)
    with torch.no_grad():
        for parameter in rel.parameters():  # never check on zeros
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    keep = torch.ones(batch, n, dtype=torch.bool)
    keep[0, n - n // 8:] = False
    return (q, k, v), rel.to(device), keep.to(device)


@contextlib.contextmanager
def poisoned_allocations():
    """Meanwhile every floating-point tensor that torch.empty, torch.empty_like or Tensor.new_empty makes is NaN
    (the kernel's launches allocate its outputs and accumulators with these), so that one the kernel should write
    and does not cannot pass for a right one."""
    import torch

    def poisoned(allocate):
        def make(*args, **kwargs):
            made = allocate(*args, **kwargs)
            return made.fill_(math.nan) if made.is_floating_point() else made
        return make

    with (mock.patch.object(torch, "empty", poisoned(torch.empty)),
          mock.patch.object(torch, "empty_like", poisoned(torch.empty_like)),
          mock.patch.object(torch.Tensor, "new_empty", poisoned(torch.Tensor.new_empty))):
        yield


def kernel_call(qkv, rel, keep, dtype, weights):
    """The kernel in `dtype`: its output and the gradients of (out * weights).sum() for q, k, v and rel's
    parameters."""
    import torch

    from convattn.attention.relative import dispatch
    from convattn.attention.relative.triton_attention import triton_relative_attention

    q, k, v = (x.detach().to(dtype).requires_grad_() for x in qkv)
    if rel is None:
        out = triton_relative_attention(q, k, v, None, None, reach=0, clip=True)
        inputs = [q, k, v]
    else:
        out = triton_relative_attention(q, k, v, **dispatch.kernel_inputs(rel, q, k), keep=keep)
        inputs = [q, k, v, *rel.parameters()]
    grads = torch.autograd.grad((out.double() * weights).sum(), inputs)
    return [out.detach(), *grads]


def sdpa_call(qkv, dtype, weights):
    import torch
    import torch.nn.functional as F

    q, k, v = (x.detach().to(dtype).requires_grad_() for x in qkv)
    out = F.scaled_dot_product_attention(q, k, v)
    return [out.detach(), *torch.autograd.grad((out.double() * weights).sum(), [q, k, v])]


def expected(qkv, rel, keep, weights):
    import torch

    q, k, v = (x.detach().clone().requires_grad_() for x in qkv)
    rel64 = copy.deepcopy(rel).double() if rel is not None else None
    out = reference(q, k, v, rel64, keep)
    inputs = [q, k, v, *(rel64.parameters() if rel64 is not None else ())]
    return [out.detach(), *torch.autograd.grad((out * weights).sum(), inputs)]


def names(rel) -> list[str]:
    return ["out", "q", "k", "v", *(name for name, _ in rel.named_parameters())] if rel is not None else [
        "out", "q", "k", "v"]


def check(case: str, shape: tuple[int, int, int], head_dim: int, dtype_name: str, device: str, design=None,
          deterministic: bool = True, tilings: int | None = 1, deadline: float = math.inf) -> dict:
    """One gate row: `case` at `shape` in `dtype_name`, inside the dQ design's context (`design`, a context manager
    factory; None: today's), at each of `tilings` tilings pinned in turn while time is left (None: once, at the
    autotuner's own pick, where the tilings cannot be pinned)."""
    import torch
    from kernel_tilings import pinned_tiling

    dtype = getattr(torch, dtype_name)
    tolerance = TOLERANCE[dtype_name]
    qkv, rel, keep = problem(case, *shape, head_dim, device)
    weights = torch.randn(*shape[:2], shape[2], head_dim, generator=torch.Generator().manual_seed(1),
                          dtype=torch.float64).to(device)
    wanted = expected(qkv, rel, keep, weights)
    labels = names(rel)
    result: dict = {"tolerance": tolerance, "tilings": {}}
    if case == "plain":
        result["sdpa_errors"] = {name: float(f"{relative_error(got, want):.3g}") for name, got, want in
                                 zip(labels, sdpa_call(qkv, dtype, weights), wanted, strict=True)}
    failed = []
    for index in range(tilings) if tilings else [None]:
        if time.time() >= deadline:
            break
        start = time.time()
        with (pinned_tiling(index) if index is not None else contextlib.nullcontext(),
              design() if design is not None else contextlib.nullcontext(), poisoned_allocations()):
            first = kernel_call(qkv, rel, keep, dtype, weights)
            second = kernel_call(qkv, rel, keep, dtype, weights) if deterministic else None
        errors = {name: relative_error(got, want) for name, got, want in zip(labels, first, wanted, strict=True)}
        said = {"errors": {name: float(f"{error:.3g}") for name, error in errors.items()},
                "seconds": round(time.time() - start, 2)}
        wrong = [f"{name} {error:.2e} > {tolerance:g}" for name, error in errors.items() if not error <= tolerance]
        if second is not None:
            said["same_bits"] = all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
            if not said["same_bits"]:
                wrong.append("two backward passes differ")
        name = "the autotuner's pick" if index is None else f"tiling {index}"
        result["tilings"][name] = said
        failed += [f"{name}: {text}" for text in wrong]
    checked, tilings = len(result["tilings"]), tilings or 1
    if failed:
        result["verdict"] = "fail"
        result["failed"] = "; ".join(failed)[:400]
    elif checked < tilings:
        result["verdict"] = "not finished"
        result["failed"] = f"{checked} of {tilings} tilings checked before the gate's time ran out"
    else:
        result["verdict"] = "pass"
    return result


def verdict(rows: list[dict], planned: int) -> str | None:
    """None where every planned gate row passed; else why the call's kernel and training rows are unverified."""
    if not rows:
        return "unverified: the gate did not run"
    bad = [row for row in rows if row.get("verdict") != "pass"]
    if not bad and len(rows) >= planned:
        return None
    row = bad[0] if bad else None
    if row is None:
        return f"unverified: the gate checked {len(rows)} of its {planned} cases"
    what = row.get("failed") or row.get("error") or row.get("verdict", "")
    word = "failed" if row.get("verdict") == "fail" or str(row.get("error", "")).startswith("failed") else (
        "did not finish")
    return f"unverified: the gate {word} ({row['gate']}, dQ {row['design']}: {what})"[:300]
