"""Composite attention on a CUDA GPU: FlexAttention against the dense-bias kernel and plain SDPA.

For each width and shape: one CompositeSelfAttention layer, forward+backward in bfloat16, for
  none               plain SDPA (the flash kernel), the baseline of every ratio,
  <preset> flex      the relative terms as a FlexAttention score_mod (the default on CUDA),
  <preset> dense     the same terms as an (n x n) bias to SDPA (its memory-efficient kernel), which is
                     what runs when attention dropout is on,
and the whole encoder of the chang2021-small/composite preset against `transformers`' BertModel with
SDPA of the same shape. Time: CUDA events, median of --reps steps after warm-up (compilation
included in the warm-up). Memory: the allocator's peak during one step minus what was allocated
before it (weights, inputs), which on CUDA is an exact count, not an estimate.

    python benchmarks/attention_gpu.py                       # widths small (H 256) and base (H 768)
    python benchmarks/attention_gpu.py --shapes 8192x1 --width base --reps 5
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import torch
from common import write_atomic
from transformers import BertConfig, BertModel

import convattn  # noqa: F401  (registers the model type)
from convattn import ConvAttnConfig, ConvAttnModel
from convattn.attention import TokenMask, composite
from convattn.attention.composite import CompositeSelfAttention

ARMS = ["composite", "composite+key", "composite+depthwise", "conv-qkv"]
WIDTHS = {"small": {}, "base": dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072)}


@contextlib.contextmanager
def dense_bias():
    """Route the relative terms through the (n x n) bias instead of FlexAttention."""
    original = composite.takes_flex_path
    composite.takes_flex_path = lambda *args: False
    try:
        yield
    finally:
        composite.takes_flex_path = original


def inputs(batch: int, n: int, width: int):
    torch.manual_seed(0)
    hidden = torch.randn(batch, n, width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    keep = torch.ones(batch, n, dtype=torch.bool, device="cuda")
    keep[0, n - n // 8:] = False
    return hidden, keep


def layer_step(preset: str, width: str, n: int, batch: int):
    config = ConvAttnConfig.from_preset(f"chang2021-small/{preset}", attention_probs_dropout_prob=0.0,
                                        max_position_embeddings=max(n, 128), **WIDTHS[width])
    layer = CompositeSelfAttention(config).cuda().to(torch.bfloat16).train()
    hidden, keep = inputs(batch, n, config.hidden_size)
    mask = TokenMask(keep)

    def step():
        layer(hidden, mask)[0].float().pow(2).mean().backward()
    return step, [hidden, *layer.parameters()]


def encoder_step(name: str, width: str, n: int, batch: int):
    config = ConvAttnConfig.from_preset("chang2021-small/composite", attention_probs_dropout_prob=0.0,
                                        max_position_embeddings=max(n, 512), **WIDTHS[width])
    if name == "bert-sdpa":
        model = BertModel(BertConfig(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
            num_attention_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
            max_position_embeddings=max(n, 512), attention_probs_dropout_prob=0.0, attn_implementation="sdpa",
        ), add_pooling_layer=False)
    else:
        model = ConvAttnModel(config)
    model = model.cuda().to(torch.bfloat16).train()
    torch.manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (batch, n), device="cuda")
    keep = torch.ones(batch, n, dtype=torch.long, device="cuda")
    keep[0, n - n // 8:] = 0

    def step():
        model(input_ids=ids, attention_mask=keep).last_hidden_state.float().pow(2).mean().backward()
    return step, list(model.parameters())


def measure(step, tensors, reps: int, warmup: int = 3) -> dict:
    def clear():
        for t in tensors:
            t.grad = None
    for _ in range(warmup):
        step()
        clear()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    clear()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        clear()
    return {"ms": statistics.median(times), "min": min(times), "max": max(times), "peak": peak}


def measure_or_none(reps: int, build, *args) -> dict | None:
    """measure() the step that build(*args) returns; None where it runs out of GPU memory."""
    try:
        return measure(*build(*args), reps)
    except torch.OutOfMemoryError:
        return None
    finally:
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="512x32,2048x8,8192x2", help="n x batch, comma-separated")
    parser.add_argument("--width", default="small,base", help="comma-separated: " + ", ".join(WIDTHS))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--no-encoder", action="store_true", help="layers only")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "attention_gpu.md")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    lines = [
        "# Composite attention on a CUDA GPU: FlexAttention vs the dense bias vs plain SDPA (issue 11)", "",
        f"Command: `python benchmarks/attention_gpu.py {' '.join(sys.argv[1:])}`".rstrip() + "  ",
        f"Machine: {torch.cuda.get_device_name()}, torch {torch.__version__}, bfloat16, attention dropout 0, "
        "1/8 of one row padded. Time: CUDA events, median [min, max] of the steps after warm-up; ratio to plain "
        "SDPA of the same width and shape (`none` for layers, `transformers` BertModel-SDPA for encoders). "
        "Memory: allocator peak during one step above what was allocated before it.", "",
        "| width | n | batch | arm | ms median [min, max] | time ratio | step peak MiB | memory ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for width in args.width.split(","):
        for n, batch in shapes:
            results = {"none": measure_or_none(args.reps, layer_step, "none", width, n, batch)}
            for preset in ARMS:
                results[f"{preset} flex"] = measure_or_none(args.reps, layer_step, preset, width, n, batch)
                with dense_bias():
                    results[f"{preset} dense"] = measure_or_none(args.reps, layer_step, preset, width, n, batch)
            if not args.no_encoder:
                for name in ("bert-sdpa", "composite"):
                    results[f"encoder {name}"] = measure_or_none(args.reps, encoder_step, name, width, n, batch)
            for arm, r in results.items():
                base = results["encoder bert-sdpa" if arm.startswith("encoder") else "none"]
                if r is None or base is None:
                    row = f"| {width} | {n} | {batch} | {arm} | out of memory | - | - | - |"
                else:
                    row = (f"| {width} | {n} | {batch} | {arm} | {r['ms']:.2f} [{r['min']:.2f}, {r['max']:.2f}] | "
                           f"{r['ms'] / base['ms']:.2f} | {r['peak'] / 2**20:.0f} | {r['peak'] / base['peak']:.2f} |")
                lines.append(row)
                print(row, flush=True)
            torch.cuda.empty_cache()
            write_atomic(args.output, "\n".join(lines) + "\n")  # what is measured survives a later failure
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
