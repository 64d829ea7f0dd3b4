"""What the fused relative-attention kernels cost a Hopper multiprocessor, read without a GPU: each kernel of
attention/relative/triton_attention.py compiled for sm_90 by Triton's own ptxas, for each tiling the autotuner
may try, with the registers per thread and the bytes spilled to the stack (local memory) that cuobjdump reports.
Spills are what to avoid: triton_attention._configs took its float32 and wide-head tilings from this table (the
half-precision ones from GPU timings, benchmarks/triton_tuning.py).

    python benchmarks/triton_resources.py                       # every tiling below, 64-channel bf16 heads
    python benchmarks/triton_resources.py --tilings 128x64x8x3 --output /tmp/r.md

Needs TRITON_INTERPRET unset (the interpreter defines no compilable kernels) and no GPU.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from common import write_atomic
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from convattn.attention.relative import triton_attention

KERNELS = {"forward": triton_attention.forward_kernel, "query": triton_attention.query_gradient_kernel,
           "key": triton_attention.key_gradient_kernel}
TILINGS = "128x64x8x3,128x32x8x2,64x64x4x2,64x32x4x2,128x64x4x3,64x16x4x2,32x64x8x2,32x128x8x2"
FLOAT_POINTERS = {"LSE", "DELTA", "DA", "DB"}


def signature(kernel, dtype: str, constants: dict) -> dict:
    """Triton's type of each argument: tensors of the operand dtype, float32 statistics and table gradients,
    the uint8 key mask, int32 sequence offsets, float scalars, int32 strides and sizes."""
    types = {}
    for name in kernel.arg_names:
        if name in constants:
            types[name] = "constexpr"
        elif name == "KEEP":
            types[name] = "*u8"
        elif name == "CU":
            types[name] = "*i32"
        elif name.isupper():
            types[name] = "*fp32" if name in FLOAT_POINTERS else f"*{dtype}"
        else:
            types[name] = "fp32" if name in ("p_drop", "scale") else "i32"
    return types


def resources(kernel_name: str, tiling: tuple[int, int, int, int], constants: dict, dtype: str) -> dict:
    block_m, block_n, warps, stages = tiling
    kernel = KERNELS[kernel_name]
    constants = dict(constants, BLOCK_M=block_m, BLOCK_N=block_n)
    source = ASTSource(kernel, signature(kernel, dtype, constants), constexprs=constants)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps, num_stages=stages))
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        report = subprocess.run([str(cuobjdump), "--dump-resource-usage", cubin.name], capture_output=True,
                                text=True, check=True).stdout
    registers, stack = re.search(r"REG:(\d+).*STACK:(\d+)", report).groups()
    return {"registers": int(registers), "spilled": int(stack), "wgmma": "wgmma" in compiled.asm["ptx"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tilings", default=TILINGS, help="BLOCK_M x BLOCK_N x warps x stages, comma-separated")
    parser.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated: " + ", ".join(KERNELS))
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "triton_resources.md")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
    tilings = [tuple(int(x) for x in t.split("x")) for t in args.tilings.split(",")]
    variants = {"composite, dropout": dict(HAS_KEY=False, DROPOUT=True),
                "composite+key, dropout": dict(HAS_KEY=True, DROPOUT=True)}
    lines = ["# The fused kernels on sm_90, read from ptxas without a GPU", "",
             f"Command: `python benchmarks/triton_resources.py {' '.join(sys.argv[1:])}`".rstrip() + "  ",
             f"triton {triton.__version__}, {args.dtype}, {args.head_dim}-channel heads, r = 8, clip, key padding. "
             "Registers per thread (255 is the most) and bytes spilled per thread.", "",
             "| kernel | BLOCK_M x BLOCK_N | warps | stages | terms | registers | spilled bytes | wgmma |",
             "|---|---|---|---|---|---|---|---|"]
    for kernel_name in args.kernels.split(","):
        for tiling in tilings:
            for variant, flags in variants.items():
                constants = dict(REACH=8, CLIP=True, HAS_ROW=True, HAS_KEEP=True, VARLEN=False, HEAD_DIM=args.head_dim,
                                 BLOCK_D=max(16, 1 << (args.head_dim - 1).bit_length()),
                                 PRECISION="ieee" if args.dtype == "fp32" else "tf32", **flags)
                r = resources(kernel_name, tiling, constants, args.dtype)
                row = (f"| {kernel_name} | {tiling[0]} x {tiling[1]} | {tiling[2]} | {tiling[3]} | {variant} | "
                       f"{r['registers']} | {r['spilled']} | {'yes' if r['wgmma'] else 'no'} |")
                lines.append(row)
                print(row, flush=True)
    write_atomic(args.output, "\n".join(lines) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
