"""Forward+backward speed and activation memory of the composite-attention family vs plain SDPA BERT.

For each preset: one encoder layer and the full BERT-small encoder (12 layers), timed against
`transformers`' own BertLayer / BertModel with SDPA attention of the same size, in the same
process. Results go to benchmarks/results/attention_speed.md (ratios > 1 mean slower than BERT).

    python benchmarks/attention_speed.py                 # all chang2021-small rows, n = 128, 512, 2048
    python benchmarks/attention_speed.py --quick         # two rows, n = 128, one rep (smoke test)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from common import machine_line, time_interleaved, write_atomic
from transformers import BertConfig, BertModel

import convattn  # noqa: F401  (registers the model type)
from convattn import ConvAttnConfig, ConvAttnModel
from convattn.attention import TokenMask
from convattn.presets import preset_names
from convattn.training.compare.memory import saved_activation_bytes

TOKENS_PER_BATCH = 2048


def hf_bert(config: ConvAttnConfig) -> BertModel:
    """HF BERT of the same shape (embedding size = hidden, as BERT has no embedding projection)."""
    bert = BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings, attn_implementation="sdpa",
    )
    return BertModel(bert, add_pooling_layer=False)


def step(module, inputs: dict) -> callable:
    def run():
        out = module(**inputs)
        out = out[0] if isinstance(out, tuple) else out.last_hidden_state
        out.float().pow(2).mean().backward()
    return run


def measure(name: str, config: ConvAttnConfig, n: int, reps: int) -> dict:
    batch = max(1, TOKENS_PER_BATCH // n)
    torch.manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (batch, n))
    keep = torch.ones(batch, n, dtype=torch.long)
    keep[0, n - n // 8:] = 0  # some padding, so masking paths run
    hidden = torch.randn(batch, n, config.hidden_size, requires_grad=True)

    ours = ConvAttnModel(config).train()
    bert = hf_bert(config).train()
    ours_layer, bert_layer = ours.encoder.layer[0], bert.encoder.layer[0]
    mask = TokenMask(keep.bool())
    bert_mask = torch.zeros(batch, 1, 1, n).masked_fill(~keep.bool()[:, None, None, :], torch.finfo(torch.float32).min)

    def ours_layer_fn():
        return ours_layer(hidden, mask)[0]

    def bert_layer_fn():
        return bert_layer(hidden, attention_mask=bert_mask)[0]

    def run_layer(fn):
        def run():
            fn().pow(2).mean().backward()
        return run

    rows = time_interleaved({"layer_ours": run_layer(ours_layer_fn), "layer_bert": run_layer(bert_layer_fn)}, reps)
    rows |= time_interleaved({"model_ours": step(ours, {"input_ids": ids, "attention_mask": keep}),
                              "model_bert": step(bert, {"input_ids": ids, "attention_mask": keep})}, reps)
    rows["mem_ours"] = saved_activation_bytes(lambda: ours(input_ids=ids, attention_mask=keep).last_hidden_state)
    rows["mem_bert"] = saved_activation_bytes(lambda: bert(input_ids=ids, attention_mask=keep).last_hidden_state)
    rows.update(name=name, n=n, batch=batch)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="chang2021-small/*", help="comma-separated globs over preset names")
    parser.add_argument("--lengths", default="128,512,2048")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="two presets, n = 128, one rep")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "attention_speed.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import fnmatch

    patterns = args.presets.split(",")
    names = [p for p in preset_names() if any(fnmatch.fnmatch(p, pattern) for pattern in patterns)]
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.quick:
        names, lengths, args.reps = ["chang2021-small/absolute", "chang2021-small/composite"], [128], 1

    results = []
    for n in lengths:
        for name in names:
            config = ConvAttnConfig.from_preset(name, max_position_embeddings=max(n, 128))
            row = measure(name, config, n, args.reps)
            results.append(row)
            print(f"n={n:5d} {name:36s} layer x{row['layer_ours'] / row['layer_bert']:.2f}  "
                  f"encoder x{row['model_ours'] / row['model_bert']:.2f}  "
                  f"({row['model_ours'] * 1e3:.0f} ms vs {row['model_bert'] * 1e3:.0f} ms)  "
                  f"memory x{row['mem_ours'] / row['mem_bert']:.2f}", flush=True)

    lines = [
        "# Composite-attention family: forward+backward vs plain SDPA BERT",
        "",
        f"Command: `python benchmarks/attention_speed.py {' '.join(sys.argv[1:])}`".rstrip() + "  ",
        f"Machine: {machine_line()}. Batch = {TOKENS_PER_BATCH} tokens (batch x n), 1/8 of one row padded, "
        f"median of {args.reps} reps after a warm-up, ours and BERT alternating within each rep.",
        "Baseline: `transformers` BertLayer / BertModel (attn_implementation='sdpa') of the same H, I, L, heads, "
        "run in the same process. Ratios > 1 mean slower / more memory than BERT. Memory = bytes autograd "
        "saves for backward over the full encoder (activation memory).",
        "",
        "| n | preset | layer time ratio | encoder time ratio | encoder ms (ours / BERT) | activation memory ratio |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['n']} | {r['name']} | {r['layer_ours'] / r['layer_bert']:.2f} | "
            f"{r['model_ours'] / r['model_bert']:.2f} | {r['model_ours'] * 1e3:.0f} / {r['model_bert'] * 1e3:.0f} | "
            f"{r['mem_ours'] / r['mem_bert']:.2f} |"
        )
    write_atomic(args.output, "\n".join(lines) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
