"""What the fused relative-attention kernels cost a Hopper multiprocessor, read without a GPU: each kernel of
attention/relative/triton/kernels.py compiled for sm_90 by Triton's own ptxas, as the JIT would compile it for a
real call, and read back from its machine code (cuobjdump):

  registers    per thread (255 is the most), and bytes spilled to the stack (local memory)
  issue        warp instructions per 1,000 scores (query-key pairs) in the loops off the band, where nearly all
               tiles are at long n, and in the band's loop: the SASS instructions of each loop's body, counted
               statically (a branch's both arms included), times the warps, over the tile's scores; a proxy for
               what a tile costs to issue, comparable across tilings
  smem         of those off the band, shared-memory loads and stores plus barriers: layout conversions
  spills       loads and stores of spilled registers in the loops off the band, and in the band's loop (spills
               around the loops cost little)
  wgmma        whether the tensor cores' Hopper path (HGMMA) is used

The call compiled is `small` width's: 4 heads of 64 channels, n = 512, q, k and v strided as the model passes them,
r = 8, clip, so that Triton specializes alignment and strides as it would on the GPU (16-byte divisibility). The
variants add one feature at a time: dropout, key padding, the row table (composite), the key table; both tables
projected inside the launches from q and k (as a layer sends them: the backward adds the key table's share of dK).
The kernels that stream rows (backward_preprocess, query_gradient_kernel, tables_kernel) are compiled too, at their
one tiling, and reported by registers and spills.

    python benchmarks/triton_resources.py                      # the autotuner's tilings, bf16, 64-channel heads
    python benchmarks/triton_resources.py --tilings 128x64x8x3 --variants plain,composite+key --output /tmp/r.md

Needs TRITON_INTERPRET unset (the interpreter defines no compilable kernels) and no GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import harness
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from convattn.attention.relative.triton import launch

KERNELS = launch.KERNELS
VARIANTS = {"plain": {}, "dropout": {"dropout"}, "padding": {"padding"},
            "composite": {"row", "padding", "dropout", "projected"},
            "composite+key": {"row", "key", "padding", "dropout", "projected"}}
# the kernels that stream ROWS rows a program, compiled at that tiling (4 warps, as launch.py launches them)
ROWS_KERNELS = {"backward_preprocess": launch.kernels.backward_preprocess,
                "query_gradient": launch.kernels.query_gradient_kernel, "tables": launch.kernels.tables_kernel}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
HEADS, LENGTH, REACH = 4, 512, 8
# a row's columns after its tiling, in the table's order
RESOURCES = ("variant", "registers", "spilled", "off_band", "band", "smem", "spill_ops", "band_spill_ops")
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def call_arguments(kernel_name: str, features: set[str], dtype: torch.dtype, head_dim: int) -> tuple[list, dict]:
    """The runtime arguments and keywords that triton/launch.py launches this kernel with, on meta tensors (their
    data pointers are 0: aligned, as the allocator's are)."""
    batch, heads, n = 2, HEADS, LENGTH
    rows = torch.empty(batch, n, 3, heads, head_dim, dtype=dtype, device="meta")  # a fused q, k, v projection
    q, k, v = (rows[:, :, part].transpose(1, 2) for part in range(3))
    tables = [torch.empty(batch, heads, n, 2 * REACH + 1, dtype=dtype, device="meta") if name in features else None
              for name in ("row", "key")]
    keep = torch.empty(batch, n, dtype=torch.uint8, device="meta") if "padding" in features else None
    seed = torch.empty((), dtype=torch.int64, device="meta") if "dropout" in features else None
    # the terms' parameters (float32, as a model's): W of the row table, U of the key table, fixed beside W
    projected = [torch.empty(head_dim, 2 * REACH + 1, device="meta") if "projected" in features and t is not None
                 else None for t in tables]
    problem = launch.Problem(q, *tables, keep, None, seed, 0, REACH, True, 0.1 if "dropout" in features else 0,
                             head_dim**-0.5, None, *projected, head_dim**-0.5)
    stats = torch.empty(problem.stats_shape, dtype=torch.float32, device="meta")
    grads = [launch.table_gradient(t, q, False) if t is not None else None for t in tables]
    out = torch.empty_like(q)
    accumulators = problem.accumulators(q, 2)
    if kernel_name == "backward_preprocess":
        return problem.preprocess_arguments(out, out, stats, *accumulators)
    if kernel_name == "query_gradient":
        return problem.query_arguments(*accumulators, out, grads[0])
    if kernel_name == "tables":
        fixed = torch.empty(heads, 2 * REACH + 1, device="meta") if projected[0] is not None else None
        _, arguments, constants = launch.tables_arguments(q, k, fixed, *projected, *tables, head_dim**-0.5)
        return arguments, constants
    arguments = {"forward": lambda: problem.forward_arguments(q, k, v, out, stats),
                 "backward": lambda: problem.backward_arguments(q, k, v, out, stats, stats, out, out, *grads,
                                                                *accumulators, 2)}[kernel_name]()
    # the backward's dQ design: the split accumulators', unless the features ask for atomic adds; the key table's
    # share of dK where it is projected
    design = problem.backward_constants("atomic" in features) if kernel_name == "backward" else {}
    return arguments, {**problem.keywords, **design}


def source(kernel_name: str, features: set[str], dtype: torch.dtype, head_dim: int, block_m: int | None = None,
           block_n: int | None = None) -> ASTSource:
    """The kernel as the JIT specializes it: each argument's type, and tt.divisibility 16 on every pointer and on
    every integer divisible by 16 that the kernel does not exempt (triton's BaseBackend.get_int_specialization).
    The tiling is the autotuned kernels' (KERNELS); the rows kernels' is in their constexprs."""
    kernel = KERNELS.get(kernel_name) or ROWS_KERNELS[kernel_name]
    arguments, keywords = call_arguments(kernel_name, features, dtype, head_dim)
    constants = {name: value for name, value in keywords.items() if name != "length_bucket"}
    runtime = [*arguments, *([keywords["length_bucket"]] if "length_bucket" in keywords else [])]
    if kernel_name in KERNELS:
        constants.update(BLOCK_M=block_m, BLOCK_N=block_n)
    values = dict(zip([name for name in kernel.arg_names if name not in constants], runtime, strict=True))
    exempt = {kernel.arg_names[p.num] for p in kernel.params if p.do_not_specialize}
    signature, attrs = {}, {}
    for index, name in enumerate(kernel.arg_names):
        if name in constants:
            signature[name] = "constexpr"
            continue
        value = values[name]
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                                     torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64"}[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if isinstance(value, float) else "i32"
            if isinstance(value, int) and name not in exempt and value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
    return ASTSource(kernel, signature, constexprs=constants, attrs=attrs)


def loop_bodies(sass: str) -> list[tuple[int, int, list[str]]]:
    """(first address, last address, instructions) of each loop (a backward branch's range), in address order."""
    code = [(int(address, 16), text) for address, text in
            re.findall(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P\w+\s+)?[A-Z][^;]*);", sass)]
    bodies = []
    for address, text in code:
        target = re.search(r"\bBRA\s+0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            start = int(target.group(1), 16)
            bodies.append((start, address, [t for a, t in code if start <= a <= address]))
    return bodies


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def resources(job: tuple) -> dict:
    kernel_name, variant, tiling, dtype_name, head_dim = job
    block_m, block_n, warps, stages = tiling
    compiled = triton.compile(source(kernel_name, VARIANTS[variant], DTYPES[dtype_name], head_dim, block_m, block_n),
                              target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([str(BIN / "cuobjdump"), "--dump-resource-usage", cubin.name], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", cubin.name], capture_output=True, text=True,
                              check=True).stdout
    registers, stack = re.search(r"REG:(\d+).*STACK:(\d+)", usage).groups()
    # the loops over tiles (those with matrix products: fused multiply-adds in float32, whose products are "ieee"):
    # left of the band, the band, right of it, in source order; the innermost ones (the backward's run inside its
    # loop over key blocks)
    multiplies = ("FFMA",) if dtype_name == "fp32" else ("HGMMA", "HMMA")
    products = [loop for loop in loop_bodies(sass) if any(opcode(t) in multiplies for t in loop[2])]
    bodies = [body for start, end, body in products
              if not any(start <= other[0] and other[1] <= end and other[:2] != (start, end) for other in products)]
    if len(bodies) != 3:
        raise RuntimeError(f"{kernel_name} {variant} {tiling}: expected 3 tile loops in SASS, found {len(bodies)}")
    off_band = max(bodies[0], bodies[2], key=len)
    shared = sum(opcode(t) in ("LDS", "STS", "BAR", "LDSM", "STSM") for t in off_band)
    spills = [sum(opcode(t) in ("LDL", "STL") for t in body) for body in (off_band, bodies[1])]
    per_thousand = 1000 * warps / (block_m * block_n)
    return {"kernel": kernel_name, "variant": variant, "tiling": tiling, "registers": int(registers),
            "spilled": int(stack), "off_band": round(len(off_band) * per_thousand),
            "band": round(len(bodies[1]) * per_thousand), "smem": round(shared * per_thousand),
            "spill_ops": round(spills[0] * per_thousand), "band_spill_ops": round(spills[1] * per_thousand),
            "wgmma": any(opcode(t) == "HGMMA" for t in off_band)}


def rows_resources(job: tuple) -> dict:
    """Registers and spilled bytes of a rows kernel (ROWS_KERNELS), compiled for sm_90 at 4 warps."""
    kernel_name, variant, dtype_name, head_dim = job
    compiled = triton.compile(source(kernel_name, VARIANTS[variant], DTYPES[dtype_name], head_dim),
                              target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=1))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([str(BIN / "cuobjdump"), "--dump-resource-usage", cubin.name], capture_output=True,
                               text=True, check=True).stdout
    registers, stack = re.search(r"REG:(\d+).*STACK:(\d+)", usage).groups()
    return {"kernel": kernel_name, "variant": variant, "registers": int(registers), "spilled": int(stack)}


def library_tilings(kernel_name: str, dtype_name: str, head_dim: int) -> list[tuple]:
    # read with TRITON_INTERPRET unset, so these are the GPU's candidates
    return launch.configs(kernel_name, head_dim, DTYPES[dtype_name])


def main() -> int:
    parser = harness.arguments(__doc__, output="triton_resources.md")
    parser.add_argument("--tilings", help="BLOCK_M x BLOCK_N x warps x stages, comma-separated (default: the "
                        "autotuner's candidates of each kernel)")
    parser.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated: " + ", ".join(KERNELS))
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
    for name, allowed in (("--kernels", KERNELS), ("--variants", VARIANTS)):
        unknown = set(getattr(args, name[2:]).split(",")) - set(allowed)
        if unknown:
            parser.error(f"{name}: unknown {sorted(unknown)}; allowed: {', '.join(allowed)}")
    kernels, variants = args.kernels.split(","), args.variants.split(",")
    given = [tuple(int(x) for x in t.split("x")) for t in args.tilings.split(",")] if args.tilings else None
    jobs = [(kernel, variant, tiling, args.dtype, args.head_dim) for kernel in kernels
            for tiling in (given or library_tilings(kernel, args.dtype, args.head_dim)) for variant in variants]
    lines = [*harness.heading("The fused kernels on sm_90, read from their machine code without a GPU"),
             f"triton {triton.__version__}, {args.dtype}, {HEADS} heads of {args.head_dim} channels, n = {LENGTH}, "
             f"r = {REACH}, clip, specialized as the JIT would. Registers per thread (255 is the most), bytes spilled "
             "per thread; issue: warp instructions per 1,000 scores in the loops off the band and in the band's "
             "loop (static SASS counts), of the former the shared-memory loads, stores and barriers, and of both the "
             "spilled registers' loads and stores.",
             "", "| kernel | BLOCK_M x BLOCK_N | warps | stages | variant | registers | spilled bytes | "
             "issue off the band | issue in the band | smem off the band | spills off the band | spills in the band | "
             "wgmma |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    # the rows kernels where their code differs: the row table projected (the tables, dQ's share) or not
    rows_jobs = [(kernel, variant, args.dtype, args.head_dim) for kernel in ROWS_KERNELS
                 for variant in variants if kernel != "tables" or "projected" in VARIANTS[variant]]
    with (harness.Run("triton_resources", machine=harness.machine_line(packages=("torch", "triton")),
                      dtype=args.dtype, head_dim=args.head_dim) as run,
          ProcessPoolExecutor(max(1, args.workers)) as pool):
        for r in pool.map(resources, jobs):
            m, n, w, s = run.add(**r)["tiling"]
            harness.emit(lines, r["kernel"], f"{m} x {n}", w, s, *(r[name] for name in RESOURCES),
                         "yes" if r["wgmma"] else "no")
        lines += ["", f"The kernels that stream {launch.ROWS} rows a program, at 4 warps:", "",
                  "| kernel | variant | registers | spilled bytes |", "|---|---|---|---|"]
        for r in pool.map(rows_resources, rows_jobs):
            run.add(**r)
            harness.emit(lines, r["kernel"], r["variant"], r["registers"], r["spilled"])
    return harness.report(args.output, lines)


if __name__ == "__main__":
    sys.exit(main())
