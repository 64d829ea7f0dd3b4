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

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import machine_line, status_bytes, write_atomic
from transformers import BertConfig, BertModel

from convattn import ConvAttnConfig, ConvAttnModel

ARMS = ["bert-sdpa", "none", "composite", "composite+key"]


def build(arm: str, n: int, batch: int, dropout: float):
    config = ConvAttnConfig.from_preset("chang2021-small/composite" if arm == "bert-sdpa" else f"chang2021-small/{arm}",
                                        attention_probs_dropout_prob=dropout, max_position_embeddings=max(n, 512))
    torch.manual_seed(0)
    if arm == "bert-sdpa":
        model = BertModel(BertConfig(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
            num_attention_heads=config.num_attention_heads, intermediate_size=config.intermediate_size,
            max_position_embeddings=config.max_position_embeddings, attention_probs_dropout_prob=dropout,
            attn_implementation="sdpa"), add_pooling_layer=False)
    else:
        model = ConvAttnModel(config)
    model.train()
    ids = torch.randint(5, config.vocab_size, (batch, n))
    keep = torch.ones(batch, n, dtype=torch.long)
    keep[0, n - n // 8:] = 0

    def step():
        model(input_ids=ids, attention_mask=keep).last_hidden_state.pow(2).mean().backward()
    return step


def measure_memory(arm: str, n: int, batch: int, dropout: float) -> dict:
    step = build(arm, n, batch, dropout)
    before = status_bytes("VmRSS")
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    peak = status_bytes("VmHWM")
    return {"arm": arm, "peak": peak, "growth": peak - before, "seconds": seconds}


def time_arms(n: int, batch: int, reps: int, dropout: float) -> dict[str, list[float]]:
    steps = {arm: build(arm, n, batch, dropout) for arm in ARMS}
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for rep in range(reps + 1):
        for arm, step in steps.items():
            start = time.perf_counter()
            step()
            if rep:
                times[arm].append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="512x4,2048x1", help="n x batch, comma-separated")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--attention-dropout", type=float, default=0.0)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "encoder_memory.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    if args.arm:
        print(json.dumps(measure_memory(args.arm, *shapes[0], args.attention_dropout)))
        return 0

    lines = [
        "# The chang2021-small encoder (12 layers), forward+backward, vs transformers' BERT-SDPA", "",
        f"Command: `python benchmarks/encoder_memory.py {' '.join(sys.argv[1:])}`".rstrip() + "  ",
        f"Machine: {machine_line()}. Attention dropout {args.attention_dropout:g}, 1/8 of one row padded. Time: "
        "median over reps [min, max], all arms taking turns in one process, ratio to `bert-sdpa`. Memory: a fresh "
        "process per arm; peak RSS and its growth during the step, ratios to `bert-sdpa`.", "",
        "| n | batch | arm | ms median [min, max] | time ratio | peak RSS MiB | peak ratio | step growth MiB | "
        "growth ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, batch in shapes:
        times = time_arms(n, batch, args.reps, args.attention_dropout)
        memory = {}
        for arm in ARMS:
            command = [sys.executable, __file__, "--arm", arm, "--shapes", f"{n}x{batch}", "--threads",
                       str(args.threads), "--attention-dropout", str(args.attention_dropout)]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            memory[arm] = json.loads(out.stdout.strip().splitlines()[-1])
        base_time, base = statistics.median(times["bert-sdpa"]), memory["bert-sdpa"]
        for arm in ARMS:
            median, mem = statistics.median(times[arm]), memory[arm]
            row = (f"| {n} | {batch} | {arm} | {median * 1e3:.0f} [{min(times[arm]) * 1e3:.0f}, "
                   f"{max(times[arm]) * 1e3:.0f}] | {median / base_time:.2f} | {mem['peak'] / 2**20:.0f} | "
                   f"{mem['peak'] / base['peak']:.2f} | {mem['growth'] / 2**20:.0f} | "
                   f"{mem['growth'] / base['growth']:.2f} |")
            lines.append(row)
            print(row, flush=True)
    write_atomic(args.output, "\n".join(lines) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
