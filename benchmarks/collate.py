"""What collating a pretraining batch costs on the host: convattn's collators (padding by filling arrays,
training/pretrain/data.py's `padded`) against the same collators padding through `tokenizer.pad` (transformers'
DataCollatorForLanguageModeling and DataCollatorWithPadding as they are), on the same batches of real rows in one
process, the arms taking turns; and, for scale, fetching the rows from the formatted dataset (what the DataLoader
does before collating). On a GPU this is the host's work between steps in the main process (25 ms a step on
2026-11-30's H200, RESULTS 9.6). Nothing here asserts a time. Rows go to benchmarks/results/collate.jsonl.

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
    args = parser.parse_args()
    if not args.text.is_file():
        raise SystemExit(f"collate: no text at {args.text}: give --text")
    from unittest import mock

    from convattn.training.pretrain import data

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
                     batch_size=args.batch_size, seq_len=args.seq_len, reps=args.reps, rows=len(rows)) as run:
        spreads = harness.spreads(arms, args.reps, warmup=2)
        for name, spread in spreads.items():
            run.add(arm=name, ms=spread.figure())
        for objective in ("mlm", "electra"):
            ratio = spreads[f"{objective}, tokenizer.pad"].median / spreads[f"{objective}, convattn"].median
            run.add(objective=objective, speedup=round(ratio, 2))
    print(f"collate: batch {args.batch_size} of {args.seq_len}-token pairs, {len(rows):,} rows, ms per batch, median "
          f"[min, max] of {args.reps}")
    for name, spread in spreads.items():
        print(f"  {name:<36} {spread.ms(2)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
