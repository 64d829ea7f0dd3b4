"""The fused relative-attention kernel's host cost per eager call, measured on CPU without a GPU: the kernels' launches
are stubbed out (triton's JITFunction.run and Autotuner.run return at once), so what is timed is the torch and Python
work around them: the public entry (an eager call: operator._EagerAttention), torch.library's operators and
autograd (what torch.compile and dispatch modes call), Problem, the argument lists and the outputs' allocations,
which a GPU call pays on its host before and between its four launches. A CPU allocation is cheaper than the CUDA
caching allocator's, and a GPU pays triton's own binding and the driver per launch on top.

    python benchmarks/triton_host_cost.py                      # triton_op operators, as on a GPU
    TRITON_INTERPRET=1 python benchmarks/triton_host_cost.py   # the interpreter's custom_op operators
    python benchmarks/triton_host_cost.py --profile 25         # and cProfile's top functions by own time
    python benchmarks/triton_host_cost.py --output benchmarks/results/triton_host_cost.md   # the table, to a file

Each arm: the least over rounds (the machine's other work only adds) of the mean time per call, 1 x 4 heads x 128 x
64, bfloat16, r = 8; plain, and composite+key (both tables, key padding, dropout). Two more problems time a
layer's whole call from its terms' parameters (the entry alone): "layer (tables by torch)" builds the composite+key
tables with torch's operators and gives them (what layers did until the tables were projected in the kernel's
launches), "layer (projected)" sends the parameters (what they do now), both with torch's own work on the tables'
products and reductions included, which a GPU pays on its host per launch. The "model: <row>" problems time a whole
masked-LM step's host work per encoder layer (12 layers' step less 1 layer's, over 11) of a chang2021-small row at
H 64 and 16 tokens, where the CPU's arithmetic is small beside the host's work: absolute's SDPA beside the kernel's
rows, as a GPU's default sends them.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import sys
from pathlib import Path

import harness
import torch
import triton.runtime.autotuner
import triton.runtime.jit
from torch._library.utils import fill_defaults  # what torch.library's autograd runs per call (arm below)

from convattn.attention.relative.triton import launch, operator

HEADS, LENGTH, HEAD_DIM, REACH = 4, 128, harness.HEAD_DIM, harness.REACH
# what each problem adds to plain attention: both tables, a key mask (every key real), dropout
FEATURES = {"plain": (), "composite+key": ("row", "key", "keep", "dropout"),
            "layer (tables by torch)": ("keep", "dropout"), "layer (projected)": ("keep", "dropout")}
MODEL_ROWS = ("absolute", "composite", "composite+key")  # the "model: <row>" problems


def stub_launches() -> None:
    """Every triton kernel call returns at once; the multiprocessor count is an H100's; the entry accepts CPU
    tensors."""
    kernel_classes = [triton.runtime.jit.JITFunction, triton.runtime.autotuner.Autotuner]
    if launch.interpreting():
        from triton.runtime.interpreter import InterpretedFunction
        kernel_classes.append(InterpretedFunction)
    for kernel_class in kernel_classes:
        kernel_class.run = lambda self, *args, **kwargs: None
    launch.multiprocessors = lambda device: 132
    operator.interpreting = lambda: True  # the entry's device check only: the operators are already registered
    from convattn.attention.relative import dispatch

    # a model's layers take the kernel as on a GPU (its default there), on these CPU tensors
    dispatch._triton_serves = lambda implementation, device, dtype: True
    dispatch.check_triton_available = lambda: None
    dispatch._check_kernel_device = lambda device: None


def bare(fn):
    """fn with the kernels called as they are (launch.direct_launches), as inside a triton_op's eager call (outside
    one wrap_triton would go through torch's higher-order operator instead)."""
    def call():
        with launch.direct_launches():
            fn()
    return call


def release(leaves: list) -> None:
    """No gradient kept from the last call, as after an optimizer's zero_grad: autograd hands its gradients over
    instead of adding them up on the CPU, which a GPU would do on the device."""
    for leaf in leaves:
        leaf.grad = None


def arms(problem: str) -> dict:
    """The calls timed: through the public entry, the operator (forward and backward through autograd), the two
    runners alone (no torch.library: wrap_triton hands back the kernel, as inside a triton_op in eager mode), and
    torch.library's argument-default filling on the forward's schema, which its autograd runs once per call."""
    if problem.startswith("model: "):
        row = problem.removeprefix("model: ")
        return {"per layer forward + backward": PerLayer(row),
                **({"per layer, the kernel through its operators": PerLayer(row, operators=True)}
                   if row != "absolute" else {})}
    q, k, v, row, key, keep, p = harness.kernel_operands(FEATURES[problem], 1, HEADS, LENGTH, requires_grad=True)
    grad = torch.randn_like(q)
    keep8 = None if keep is None else keep.view(torch.uint8)
    seed = torch.tensor(5) if p else None
    options = (0, REACH, True, p, HEAD_DIM**-0.5)
    inputs = (q, k, v, row, key, keep8, None, seed, *options)
    detached = [None if x is None else x.detach() for x in inputs[:5]]
    out, lse = torch.empty_like(q), torch.empty(launch.stats_shape(q, False))
    schema = torch.ops.convattn.triton_relative_attention.default._schema

    leaves = [x for x in (q, k, v, row, key) if x is not None]
    if problem.startswith("layer"):
        return {"entry forward + backward": layer_entry(problem, q, k, v, keep, p, grad)}

    def entry():
        release(leaves)
        operator.triton_relative_attention(q, k, v, row, key, reach=REACH, clip=True, keep=keep,
                                           dropout_p=p).backward(grad)

    def through_operator():
        release(leaves)
        operator.attention_forward(*inputs)[0].backward(grad)

    def run_forward():
        launch.run_forward(*detached, keep8, None, seed, *options)

    def run_backward():
        launch.run_backward(grad, *detached[:3], out, lse, *detached[3:], keep8, None, seed, *options)

    def runners():
        run_forward()
        run_backward()

    return {"entry forward + backward": entry, "operator forward + backward": through_operator,
            "run_forward + run_backward": bare(runners), "run_forward": bare(run_forward),
            "run_backward": bare(run_backward),
            "fill_defaults of the forward's schema": lambda: fill_defaults(schema, inputs, {})}


def layer_entry(problem: str, q, k, v, keep, p, grad):
    """A layer's call of the entry from composite+key's parameters (bf16, as the model's): the tables built by
    torch and given, or the parameters sent (dispatch.kernel_inputs)."""
    from convattn.attention.relative import RelativePositionBias, dispatch

    rel = RelativePositionBias(["fixed", "dynamic_query", "dynamic_key"], HEADS, HEAD_DIM, REACH, "clip")
    rel = rel.to(torch.bfloat16)
    leaves = [q, k, v, *rel.parameters()]
    tables_from = (q, k) if problem == "layer (tables by torch)" else None  # (q, k): built by torch, given

    def entry():
        release(leaves)
        operator.triton_relative_attention(q, k, v, **dispatch.kernel_inputs(rel, q, k, tables_from), keep=keep,
                                           dropout_p=p).backward(grad)
    return entry


class PerLayer:
    """A masked-LM step's host work per encoder layer: the step of `layers` layers less the step of one, over the
    difference, each timed by harness.least_per_call; with `operators`, the kernel's eager calls sent through
    torch.library's operators (as before operator._EagerAttention) instead."""

    def __init__(self, row: str, layers: int = 12, operators: bool = False):
        self.steps = [model_step(row, count) for count in (1, layers)]
        self.layers, self.operators = layers, operators

    def measure(self, calls: int, rounds: int) -> float:
        with harness.through_operators() if self.operators else contextlib.nullcontext():
            one, many = (harness.least_per_call(step, calls, rounds, warmup=5) for step in self.steps)
        return (many - one) / (self.layers - 1)


def model_step(row: str, layers: int):
    """One masked-LM training step (forward with the loss, backward) of chang2021-small/<row> at H 64, 4 heads,
    intermediate 128, vocabulary 1,000, batch 1 of 16 tokens (5 of them padding), dropout on."""
    from convattn.config import ConvAttnConfig
    from convattn.model import ConvAttnForMaskedLM
    from convattn.presets import preset_fields

    fields = preset_fields(f"chang2021-small/{row}") | dict(num_hidden_layers=layers, vocab_size=1000, hidden_size=64,
                                                            num_attention_heads=4, intermediate_size=128)
    model = ConvAttnForMaskedLM(ConvAttnConfig(**fields)).train()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (1, 16), generator=generator)
    mask = torch.ones(1, 16, dtype=torch.long)
    mask[0, -5:] = 0
    labels = torch.full((1, 16), -100)
    labels[0, 3] = 7
    parameters = list(model.parameters())

    def step():
        release(parameters)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", default=",".join(["plain", "composite+key",
                                                         *(f"model: {row}" for row in MODEL_ROWS)]))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N (tottime) per problem")
    parser.add_argument("--output", type=Path, default=None, help="also write the table (markdown) to this file")
    args = parser.parse_args()
    stub_launches()
    torch.set_num_threads(1)
    operators = "custom_op" if launch.interpreting() else "triton_op"
    print(f"torch {torch.__version__}, operators: {operators}")
    machine = harness.machine_line()
    lines = [*harness.heading(f"Host cost per eager call of the fused kernel, its launches stubbed ({machine})"),
             f"torch {torch.__version__}, {operators} operators; the least of {args.rounds} rounds of {args.calls} "
             "calls' mean", "", "| problem | arm | us per call |", "|---|---|---:|"]
    with harness.Run("triton_host_cost", machine=machine, operators=operators, calls=args.calls,
                     rounds=args.rounds) as run:
        for problem in args.problems.split(","):
            for name, fn in arms(problem).items():
                seconds = fn.measure(args.calls // 10 or 1, args.rounds) if isinstance(fn, PerLayer) else \
                    harness.least_per_call(fn, args.calls, args.rounds, warmup=20)
                us = seconds * 1e6
                run.add(problem=problem, arm=name, us_per_call=round(us, 2))
                print(f"{problem:22} {name:48} {us:8.1f} us", flush=True)
                lines.append(f"| {problem} | {name} | {us:.1f} |")
                if args.output:  # what is measured survives a later failure
                    harness.report(args.output, lines, quiet=True)
            if args.profile and not problem.startswith("model: "):
                profiler = cProfile.Profile()
                fn = arms(problem)["entry forward + backward"]
                profiler.enable()
                for _ in range(args.calls):
                    fn()
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
