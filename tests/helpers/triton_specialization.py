"""Run without TRITON_INTERPRET (the interpreter has no JIT binder): every launch the kernels get, across shapes,
dtypes, tables, padding, packing and misaligned views, keyed by launch.specialization, must map to one
specialization of Triton's own binder for CUDA, and the launcher's argument list must be the binder's. Prints the
number of calls and distinct keys."""

from __future__ import annotations

import itertools

import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

from convattn.attention.relative.triton import launch

KERNELS = launch.KERNELS
TILING = {"BLOCK_M": 64, "BLOCK_N": 32}


def operand(shape, dtype, misaligned=False):
    """A tensor of `shape`, 2 or 4 bytes past a 16-byte boundary where misaligned."""
    size = torch.Size(shape).numel()
    return torch.zeros(size + 1, dtype=dtype)[int(misaligned):int(misaligned) + size].view(shape)


def problems():
    for dtype, n, heads, row, key, padded, varlen, misaligned in itertools.product(
            (torch.bfloat16, torch.float32), (1, 16, 17, 48), (1, 4), (False, True), (False, True), (False, True),
            (False, True), (False, True)):
        if padded and varlen:
            continue
        batch, d = 2, 64
        if varlen:
            q, k, v = (operand((batch * n, heads, d), dtype, misaligned and part == 0) for part in range(3))
            cu = torch.tensor([0, n, 2 * n], dtype=torch.int32)
            tables = [operand((batch * n, heads, 17), torch.float32) if on else None for on in (row, key)]
        else:
            fused = operand((batch, n, 3, heads, d), dtype, misaligned)  # a fused projection, as the model passes it
            q, k, v = (fused[:, :, part].transpose(1, 2) for part in range(3))
            cu = None
            tables = [operand((batch, heads, n, 17), torch.float32) if on else None for on in (row, key)]
        keep = torch.ones(batch, n, dtype=torch.uint8) if padded else None
        problem = launch.Problem(q, *tables, keep, cu, n, 8, True, 0.1, d**-0.5, 12345)
        stats = torch.zeros(problem.stats_shape, dtype=torch.float32)
        grads = [launch.table_gradient(t, q, varlen) if t is not None else None for t in tables]
        out = torch.empty_like(q)
        yield "forward", problem.forward_arguments(q, k, v, out, stats), problem.keywords()
        yield "query", problem.query_arguments(q, k, v, out, out, stats, stats, out, grads[0]), problem.keywords()
        yield "key", problem.key_arguments(q, k, v, out, stats, stats, out, out, grads[1]), problem.keywords()


def main():
    backend = make_backend(GPUTarget("cuda", 90, 32))
    binders = {name: create_function_from_signature(f.signature, f.params, backend) for name, f in KERNELS.items()}
    seen: dict[tuple, list] = {}
    calls = 0
    for round_ in range(2):  # the second round's fresh tensors must find the first round's keys
        for name, args, keywords in problems():
            params, specialization, _ = binders[name](*args, **keywords, **TILING)
            ours = (name, launch.specialization(tuple(args)))
            if round_ == 1:
                assert ours in seen, f"{name}: a fresh call of the same problem found no earlier key"
            assert seen.setdefault(ours, specialization) == specialization, \
                f"{name}: one key, two specializations:\n{seen[ours]}\n{specialization}"
            ordered = launch.launch_arguments(KERNELS[name], tuple(args), {**keywords, **TILING, "num_warps": 4})
            assert len(ordered) == len(params) and all(a is b for a, b in zip(ordered, params.values(), strict=True)), \
                f"{name}: the launcher's arguments are not the binder's"
            calls += 1
    distinct = len({repr(spec) for spec in seen.values()})
    print(f"{calls} calls, {len(seen)} keys, {distinct} specializations")


if __name__ == "__main__":
    main()
