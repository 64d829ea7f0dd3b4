"""The whole chang2021-small encoder (12 layers, H 256), forward+backward, against `transformers`' BERT with
SDPA attention of the same shape: time in one process (arms taking turns) and peak memory in a fresh process
per arm.

Peak memory is the process's peak resident set (VmHWM) and its growth during one training step (peak minus the
resident memory after building the model and inputs). 1/8 of one row is padded. Attention dropout is a flag:
with dropout > 0, CPU SDPA runs its math kernel for every arm (BERT included); with 0, BERT gets the fused
flash kernel and convattn its dense-bias or decomposed path. Results go to benchmarks/results/encoder_memory.md.

    python benchmarks/encoder_memory.py                                  # n = 512 (batch 4), 2048 (batch 1)
    python benchmarks/encoder_memory.py --attention-dropout 0.1 --output benchmarks/results/encoder_memory_dropout.md
"""

from __future__ import annotations

import sys

import harness
import torch
from transformers import BertModel

from convattn import ConvAttnConfig, ConvAttnModel

ARMS = ["bert-sdpa", "none", "composite", "composite+key"]


def build(arm: str, n: int, batch: int, dropout: float):
    config = ConvAttnConfig.from_preset("chang2021-small/composite" if arm == "bert-sdpa" else f"chang2021-small/{arm}",
                                        attention_probs_dropout_prob=dropout, max_position_embeddings=max(n, 512))
    torch.manual_seed(0)
    if arm == "bert-sdpa":
        model = BertModel(harness.bert_config(config), add_pooling_layer=False)
    else:
        model = ConvAttnModel(config)
    model.train()
    ids = torch.randint(5, config.vocab_size, (batch, n))
    keep = harness.padded_keep(batch, n, dtype=torch.long)

    def step():
        model(input_ids=ids, attention_mask=keep).last_hidden_state.pow(2).mean().backward()
    return step


def main() -> int:
    parser = harness.arguments(__doc__, shapes="512x4,2048x1", reps=5, threads=2, output="encoder_memory.md", arm=True)
    parser.add_argument("--attention-dropout", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = harness.shapes(args.shapes)
    if args.arm:
        return harness.measure_arm(args.arm, build, *shapes[0], args.attention_dropout)

    about = (f"Machine: {harness.machine_line()}. Attention dropout {args.attention_dropout:g}, 1/8 of one row padded. "
             "Time: median over reps [min, max], all arms taking turns in one process, ratio to `bert-sdpa`. Memory: a "
             "fresh process per arm; peak RSS and its growth during the step, ratios to `bert-sdpa`.")
    title = "The chang2021-small encoder (12 layers), forward+backward, vs transformers' BERT-SDPA"
    lines = [
        *harness.heading(title, about), "",
        "| n | batch | arm | ms median [min, max] | time ratio | peak RSS MiB | peak ratio | step growth MiB | "
        "growth ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    child = ["--threads", str(args.threads), "--attention-dropout", str(args.attention_dropout)]
    with harness.Run("encoder_memory", dropout=args.attention_dropout) as run:
        for n, batch in shapes:
            times = harness.spreads({arm: build(arm, n, batch, args.attention_dropout) for arm in ARMS}, args.reps)
            memory = harness.fresh_processes(__file__, ARMS, ["--shapes", f"{n}x{batch}", *child])
            base_time, base = times["bert-sdpa"].median, memory["bert-sdpa"]
            for arm in ARMS:
                spread, mem = times[arm], memory[arm]
                ratios = spread.median / base_time, mem["peak"] / base["peak"], mem["growth"] / base["growth"]
                run.add(n=n, batch=batch, arm=arm, ms=spread.figure(), peak_mib=round(mem["peak"] / 2**20, 1),
                        growth_mib=round(mem["growth"] / 2**20, 1),
                        **dict(zip(("time_ratio", "peak_ratio", "growth_ratio"), (round(r, 3) for r in ratios),
                                   strict=True)))
                harness.emit(lines, n, batch, arm, spread.ms(), f"{ratios[0]:.2f}", f"{mem['peak'] / 2**20:.0f}",
                             f"{ratios[1]:.2f}", f"{mem['growth'] / 2**20:.0f}", f"{ratios[2]:.2f}")
    return harness.report(args.output, lines)


if __name__ == "__main__":
    sys.exit(main())
