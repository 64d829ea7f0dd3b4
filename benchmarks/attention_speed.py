"""Forward+backward speed and activation memory of the composite-attention family vs plain SDPA BERT.

For each preset: one encoder layer and the full BERT-small encoder (12 layers), timed against
`transformers`' own BertLayer / BertModel with SDPA attention of the same size, in the same
process. Results go to benchmarks/results/attention_speed.md (ratios > 1 mean slower than BERT).

    python benchmarks/attention_speed.py                 # all chang2021-small rows, n = 128, 512, 2048
    python benchmarks/attention_speed.py --quick         # two rows, n = 128, one rep (smoke test)
"""

from __future__ import annotations

import sys

import harness
import torch
from transformers import BertModel

import convattn  # noqa: F401  (registers the model type)
from convattn import ConvAttnConfig, ConvAttnModel
from convattn.attention import TokenMask
from convattn.presets import preset_names
from convattn.training.compare.memory import saved_activation_bytes

TOKENS_PER_BATCH = 2048


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
    keep = harness.padded_keep(batch, n, dtype=torch.long)
    hidden = torch.randn(batch, n, config.hidden_size, requires_grad=True)

    ours = ConvAttnModel(config).train()
    bert = BertModel(harness.bert_config(config), add_pooling_layer=False).train()
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

    rows = harness.time_interleaved({"layer_ours": run_layer(ours_layer_fn),
                                     "layer_bert": run_layer(bert_layer_fn)}, reps)
    rows |= harness.time_interleaved({"model_ours": step(ours, {"input_ids": ids, "attention_mask": keep}),
                                      "model_bert": step(bert, {"input_ids": ids, "attention_mask": keep})}, reps)
    rows["mem_ours"] = saved_activation_bytes(lambda: ours(input_ids=ids, attention_mask=keep).last_hidden_state)
    rows["mem_bert"] = saved_activation_bytes(lambda: bert(input_ids=ids, attention_mask=keep).last_hidden_state)
    rows.update(name=name, n=n, batch=batch)
    return rows


def main() -> int:
    parser = harness.arguments(__doc__, reps=5, threads=2, output="attention_speed.md")
    parser.add_argument("--presets", default="chang2021-small/*", help="comma-separated globs over preset names")
    parser.add_argument("--lengths", default="128,512,2048")
    parser.add_argument("--quick", action="store_true", help="two presets, n = 128, one rep")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import fnmatch

    patterns = args.presets.split(",")
    names = [p for p in preset_names() if any(fnmatch.fnmatch(p, pattern) for pattern in patterns)]
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.quick:
        names, lengths, args.reps = ["chang2021-small/absolute", "chang2021-small/composite"], [128], 1

    lines = [
        *harness.heading("Composite-attention family: forward+backward vs plain SDPA BERT"),
        f"Machine: {harness.machine_line()}. Batch = {TOKENS_PER_BATCH} tokens (batch x n), 1/8 of one row padded, "
        f"median of {args.reps} reps after a warm-up, ours and BERT alternating within each rep.",
        "Baseline: `transformers` BertLayer / BertModel (attn_implementation='sdpa') of the same H, I, L, heads, "
        "run in the same process. Ratios > 1 mean slower / more memory than BERT. Memory = bytes autograd "
        "saves for backward over the full encoder (activation memory).",
        "",
        "| n | preset | layer time ratio | encoder time ratio | encoder ms (ours / BERT) | activation memory ratio |",
        "|---|---|---|---|---|---|",
    ]
    with harness.Run("attention_speed", reps=args.reps) as run:
        for n in lengths:
            for name in names:
                config = ConvAttnConfig.from_preset(name, max_position_embeddings=max(n, 128))
                r = measure(name, config, n, args.reps)
                ratios = (r["layer_ours"] / r["layer_bert"], r["model_ours"] / r["model_bert"],
                          r["mem_ours"] / r["mem_bert"])
                run.add(n=n, preset=name, batch=r["batch"], layer_ratio=round(ratios[0], 3),
                        encoder_ratio=round(ratios[1], 3), encoder_ms=round(r["model_ours"] * 1e3, 2),
                        bert_encoder_ms=round(r["model_bert"] * 1e3, 2), memory_ratio=round(ratios[2], 3))
                print(f"n={n:5d} {name:36s} layer x{ratios[0]:.2f}  encoder x{ratios[1]:.2f}  "
                      f"({r['model_ours'] * 1e3:.0f} ms vs {r['model_bert'] * 1e3:.0f} ms)  memory x{ratios[2]:.2f}",
                      flush=True)
                lines.append(f"| {n} | {name} | {ratios[0]:.2f} | {ratios[1]:.2f} | {r['model_ours'] * 1e3:.0f} / "
                             f"{r['model_bert'] * 1e3:.0f} | {ratios[2]:.2f} |")
    return harness.report(args.output, lines)


if __name__ == "__main__":
    sys.exit(main())
