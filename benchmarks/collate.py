"""What collating a pretraining batch costs on the host: convattn's collators (padding by filling arrays,
training/pretrain/data.py's `padded`) against the same collators padding through `tokenizer.pad` (transformers'
DataCollatorForLanguageModeling and DataCollatorWithPadding as they are), on the same batches of real rows in one
process, the arms taking turns; and, for scale, fetching the rows from the formatted dataset (what the DataLoader
does before collating), and what the main process waits for a batch from `convattn pretrain`'s loader without and
with its worker processes (a GPU's), a step's sleep between batches. On a GPU this is the host's work between steps
in the main process (25 ms a step on 2026-11-30's H200, RESULTS 9.6). Nothing here asserts a time. Rows go to
benchmarks/results/collate.jsonl.

    python benchmarks/collate.py                      # WikiText-103 valid as chang2021-small's pairs, batch 128
    python benchmarks/collate.py --batch-size 32 --reps 50 --tokenizer .gpu-kit/tokenizer
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import harness


def setup(args):
    """The formatted rows (the recipe's sentence pairs of WikiText-103 valid) and the tokenizer."""
    import datasets

    from convattn.data.formatting import format_dataset
    from convattn.data.tokenizer import load_tokenizer, train_tokenizer

    lines = [line for line in args.text.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = datasets.Dataset.from_dict({"text": lines})
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else train_tokenizer(texts, args.vocab_size, 128)
    return format_dataset(texts, tokenizer, "pairs", args.seq_len), tokenizer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, default=harness.DATA / "wikitext-103-raw" / "wiki.valid.raw")
    parser.add_argument("--tokenizer", help="a tokenizer folder (default: a unigram one trained on --text)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--step-ms", type=float, default=40.0,
                        help="the step between a loader's batches (a GPU's: 44 ms for chang2021-small on an H200)")
    args = parser.parse_args()
    if not args.text.is_file():
        raise SystemExit(f"collate: no text at {args.text}: give --text")
    from unittest import mock

    from convattn.training.pretrain import data
    from convattn.training.pretrain.trainer import LOADER_WORKERS

    rows, tokenizer = setup(args)
    order = random.Random(0).sample(range(len(rows)), len(rows))
    batches = [order[k:k + args.batch_size] for k in range(0, len(order) - args.batch_size + 1, args.batch_size)]
    features = [rows[batch] for batch in batches[:args.reps + 1]]  # rows as the dataset's __getitems__ returns them
    features = [[dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
                for columns in features]
    masking, padding = data.MaskingCollator(tokenizer, 0.15, 0), data.padding_collator(tokenizer)
    turns = iter(range(10**9))

    def through_tokenizer_pad(collate):
        def call():
            with mock.patch.object(data, "padded", lambda rows, tokenizer: None):
                collate(features[next(turns) % len(features)])
        return call

    arms = {
        "fetch the rows (dataset[indices])": lambda: rows[batches[next(turns) % len(batches)]],
        "mlm, tokenizer.pad": through_tokenizer_pad(masking),
        "mlm, convattn": lambda: masking(features[next(turns) % len(features)]),
        "electra, tokenizer.pad": through_tokenizer_pad(padding),
        "electra, convattn": lambda: padding(features[next(turns) % len(features)]),
    }
    with harness.Run("collate", machine=harness.machine_line(packages=("torch", "transformers", "tokenizers")),
                     batch_size=args.batch_size, seq_len=args.seq_len, reps=args.reps, rows=len(rows),
                     step_ms=args.step_ms) as run:
        spreads = harness.spreads(arms, args.reps, warmup=2)
        for workers in (0, LOADER_WORKERS):
            name = f"the main process's wait, {workers} workers"
            spreads[name] = harness.Spread.of(loader_waits(rows, masking, args, workers))
        for name, spread in spreads.items():
            run.add(arm=name, ms=spread.figure())
        for objective in ("mlm", "electra"):
            ratio = spreads[f"{objective}, tokenizer.pad"].median / spreads[f"{objective}, convattn"].median
            run.add(objective=objective, speedup=round(ratio, 2))
    print(f"collate: batch {args.batch_size} of {args.seq_len}-token pairs, {len(rows):,} rows, ms per batch, median "
          f"[min, max] of {args.reps}; a loader's waits with a {args.step_ms:g} ms step between batches")
    for name, spread in spreads.items():
        print(f"  {name:<36} {spread.ms(2)}")
    return 0


def loader_waits(rows, collate, args, workers: int) -> list[float]:
    """Seconds the main process waits for each batch from a DataLoader (fetching and collating it, or taking a
    worker's), with `args.step_ms` of a step between batches (a sleep: a GPU's step, the host free meanwhile), the
    loader made as `convattn pretrain`'s (persistent workers); the first two batches left out (the workers start)."""
    import time

    import torch

    loader = torch.utils.data.DataLoader(rows, batch_size=args.batch_size, shuffle=True, collate_fn=collate,
                                         num_workers=workers, persistent_workers=workers > 0,
                                         generator=torch.Generator().manual_seed(0))
    waits: list[float] = []
    while len(waits) < args.reps + 2:  # epochs of the rows until there are enough batches
        batches = iter(loader)
        while len(waits) < args.reps + 2:
            start = time.perf_counter()
            if next(batches, None) is None:
                break
            waits.append(time.perf_counter() - start)
            time.sleep(args.step_ms / 1e3)
    return waits[2:]


if __name__ == "__main__":
    raise SystemExit(main())
