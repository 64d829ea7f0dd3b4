"""Relative attention on a CUDA GPU: the path dispatch.py takes by default against plain SDPA with the same dropout.

For each attention dropout (0 and 0.1), width and shape, bfloat16, forward+backward, in training mode:
  layer none             CompositeSelfAttention without relative terms: plain SDPA, the baseline of the layers,
  layer <preset>         the relative terms on the path dispatch.py chooses (the line above the table names it),
  layer <preset> flex    the same terms as a FlexAttention score_mod (attn_implementation="flex_attention";
                         no dropout, so only at dropout 0),
  encoder bert-sdpa      `transformers`' BertModel with SDPA, the baseline of the encoders,
  encoder composite      the whole chang2021-small/composite encoder of the same width.
Every arm pads 1/8 of one row. Time: CUDA events, median [min, max] of --reps steps after warm-up (compilation
included in the warm-up). Memory: the allocator's peak during one step minus what was allocated before it
(weights, inputs), an exact count on CUDA. Results go to benchmarks/results/attention_gpu.md.
benchmarks/gpu_session.py, the one command of a GPU session, measures attention alone (the fused kernel against
SDPA, the device's kernel sums) and the product's training step; this script measures whole layers and encoders,
other shapes and FlexAttention.

    python benchmarks/attention_gpu.py                                   # everything (about 10 minutes on an H100)
    python benchmarks/attention_gpu.py --shapes 8192x2 --no-encoder --dropout 0.1
"""

from __future__ import annotations

import math
import statistics
import sys
import time

import harness
import torch
from transformers import BertModel

import convattn  # noqa: F401  (registers the model type)
from convattn import ConvAttnConfig, ConvAttnModel
from convattn.attention import TokenMask
from convattn.attention.composite import CompositeSelfAttention
from convattn.attention.relative import dispatch

PRESETS = ["composite", "composite+key"]
WIDTHS = {"small": {}, "base": dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072)}


def on_path(step, path: str | None):
    """`step` with the relative terms forced onto `path` (dispatch.RELATIVE_PATHS), or as dispatch.py chooses."""
    if path is None:
        return step

    def forced():
        with dispatch.forced_path(path):
            step()
    return forced


def layer_step(preset: str, width: dict, n: int, batch: int, dropout: float, implementation: str = "sdpa", *,
               path: str | None = None, device: str = "cuda", dtype=torch.bfloat16):
    """One CompositeSelfAttention forward + backward in training mode; `width` overrides the preset's config."""
    config = ConvAttnConfig.from_preset(f"chang2021-small/{preset}", attention_probs_dropout_prob=dropout,
                                        max_position_embeddings=max(n, 128), attn_implementation=implementation,
                                        **width)
    layer = CompositeSelfAttention(config).to(device, dtype).train()
    torch.manual_seed(0)
    hidden = torch.randn(batch, n, config.hidden_size, device=device, dtype=dtype, requires_grad=True)
    mask = TokenMask(harness.padded_keep(batch, n, device))

    def step():
        layer(hidden, mask)[0].float().pow(2).mean().backward()
    return on_path(step, path), [hidden, *layer.parameters()]


def encoder_step(name: str, width: dict, n: int, batch: int, dropout: float | None, *, path: str | None = None,
                 device: str = "cuda", dtype=torch.bfloat16):
    """The chang2021-small/composite encoder ("composite") or transformers' BertModel-SDPA of its shape
    ("bert-sdpa"), forward + backward in training mode; attention dropout `dropout`, or the preset's if None."""
    overrides = {} if dropout is None else {"attention_probs_dropout_prob": dropout}
    config = ConvAttnConfig.from_preset("chang2021-small/composite", max_position_embeddings=max(n, 512),
                                        **overrides, **width)
    if name == "bert-sdpa":
        model = BertModel(harness.bert_config(config), add_pooling_layer=False)
    else:
        model = ConvAttnModel(config)
    model = model.to(device, dtype).train()
    torch.manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (batch, n), device=device)
    keep = harness.padded_keep(batch, n, device, torch.long)

    def step():
        model(input_ids=ids, attention_mask=keep).last_hidden_state.float().pow(2).mean().backward()
    return on_path(step, path), list(model.parameters())


def measure(step, tensors, reps: int, warmup: int = 3, seconds: float = math.inf) -> dict:
    """Milliseconds per step, median [min, max] of up to `reps` steps after `warmup` (fewer once `seconds` have
    gone on them; at least one), CUDA events on a GPU; and on a GPU the allocator's peak during one step above
    what was allocated before it, in bytes (None on CPU)."""
    cuda = tensors[0].device.type == "cuda"

    def clear():
        for t in tensors:
            t.grad = None
    for _ in range(warmup):
        step()
        clear()
    peak = None
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        clear()
    times, stop = [], time.perf_counter() + seconds
    while len(times) < reps and (not times or time.perf_counter() < stop):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
        clear()
    return {"ms": statistics.median(times), "min": min(times), "max": max(times), "reps": len(times), "peak": peak}


def measure_or_none(reps: int, build, *args) -> dict | None:
    """measure() the step that build(*args) returns; None where it runs out of GPU memory."""
    try:
        return measure(*build(*args), reps)
    except torch.OutOfMemoryError:
        return None
    finally:
        torch.cuda.empty_cache()


def main() -> int:
    parser = harness.arguments(__doc__, shapes="512x32,2048x8,8192x2", reps=20, output="attention_gpu.md")
    parser.add_argument("--width", default="small,base", help="comma-separated: " + ", ".join(WIDTHS))
    parser.add_argument("--dropout", default="0,0.1", help="attention dropout values, comma-separated")
    parser.add_argument("--no-encoder", action="store_true", help="layers only")
    parser.add_argument("--no-flex", action="store_true", help="without the FlexAttention arms")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    shapes = harness.shapes(args.shapes)
    probe = torch.empty(1, 1, 1, 64, device="cuda", dtype=torch.bfloat16)
    path = dispatch.relative_path(probe, "sdpa", 0.1, False)
    machine = harness.machine_line("cuda", threads=False)
    lines = [
        *harness.heading("Relative attention on a CUDA GPU: the default path vs plain SDPA with the same dropout"),
        f"Machine: {machine}, bfloat16, training mode, 1/8 of one "
        f"row padded; relative terms with attn_implementation='sdpa' take the `{path}` path. Time: CUDA events, "
        "median [min, max] of the steps after warm-up; ratio to the baseline of the same dropout, width and shape "
        "(`layer none`, plain SDPA, for layers; `transformers` BertModel-SDPA for encoders). Memory: allocator "
        "peak during one step above what was allocated before it.", "",
        "| dropout | width | n | batch | arm | ms median [min, max] | time ratio | step peak MiB | memory ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with harness.Run("attention_gpu", machine=machine, path=path, reps=args.reps) as run:
        for dropout in (float(p) for p in args.dropout.split(",")):
            for width in args.width.split(","):
                for n, batch in shapes:
                    measure_shape(run, lines, args, dropout, width, n, batch)
                    harness.report(args.output, lines, quiet=True)  # what is measured survives a later failure
    print(f"wrote {args.output}")
    return 0


def measure_shape(run: harness.Run, lines: list[str], args, dropout: float, width: str, n: int, batch: int) -> None:
    shape = WIDTHS[width]
    results = {"layer none": measure_or_none(args.reps, layer_step, "none", shape, n, batch, dropout)}
    for preset in PRESETS:
        results[f"layer {preset}"] = measure_or_none(args.reps, layer_step, preset, shape, n, batch, dropout)
        if not args.no_flex and dropout == 0:
            results[f"layer {preset} flex"] = measure_or_none(args.reps, layer_step, preset, shape, n, batch,
                                                              dropout, "flex_attention")
    if not args.no_encoder:
        for name in ("bert-sdpa", "composite"):
            results[f"encoder {name}"] = measure_or_none(args.reps, encoder_step, name, shape, n, batch, dropout)
    for arm, r in results.items():
        base = results["encoder bert-sdpa" if arm.startswith("encoder") else "layer none"]
        cells = (f"{dropout:g}", width, n, batch, arm)
        figure = run.add(dropout=dropout, width=width, n=n, batch=batch, arm=arm, measured=r)
        if r is None or base is None:
            harness.emit(lines, *cells, "out of memory", "-", "-", "-")
            continue
        figure.update(time_ratio=round(r["ms"] / base["ms"], 3), memory_ratio=round(r["peak"] / base["peak"], 3))
        harness.emit(lines, *cells, f"{r['ms']:.2f} [{r['min']:.2f}, {r['max']:.2f}]", f"{r['ms'] / base['ms']:.2f}",
                     f"{r['peak'] / 2**20:.0f}", f"{r['peak'] / base['peak']:.2f}")


if __name__ == "__main__":
    sys.exit(main())
