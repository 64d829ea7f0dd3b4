"""Fine-tuning examples/s on real GLUE lengths: convattn padded and padding-free against transformers' BERT (SDPA).

A step is forward + backward + AdamW of a sequence classifier (train mode, dropout 0.1) on a batch of 32 real
training examples of SST-2, CoLA or MRPC, tokenized by convattn's own tokenizer (a unigram model) fitted here on
those tasks' training text ([CLS] a [SEP] (b [SEP]), BERT's layout). Arms, all of the same shape (4 layers, hidden
256, 4 heads, intermediate 1024, embedding 256, the same vocabulary):

* `BERT-SDPA`: transformers' BertForSequenceClassification, attn_implementation="sdpa", batches padded to their
  longest example (DataCollatorWithPadding's layout);
* `<preset> padded`: convattn on the same padded batches, its padding-free route turned off (today's computation);
* `<preset> padding-free`: the same padded batches, which convattn runs on their real tokens only (the default);
* `<preset> flattened`: the batches laid out by transformers' DataCollatorWithFlattening (one row, position_ids
  restarting at every example).

Every arm runs the same batches; the arms take turns within every repetition, in one process, so that a slow
phase of the machine hits all of them alike (benchmarks/harness.py). Nothing here asserts a time. Results go to
benchmarks/results/padding_free.md.

    python benchmarks/padding_free.py                      # SST-2, CoLA, MRPC; absolute and composite; 2 threads
    python benchmarks/padding_free.py --tasks SST-2 --reps 3 --batches 4   # a quick look
"""

from __future__ import annotations

import csv
import random
import statistics
import sys
import time
from pathlib import Path

import harness
import torch
from transformers import BertForSequenceClassification, DataCollatorWithFlattening

import convattn.padding_free as routing
from convattn import ConvAttnConfig, ConvAttnForMaskedLM, ConvAttnForSequenceClassification

GLUE = harness.DATA / "glue_data"
RESULTS = Path(__file__).resolve().parent / "results" / "padding_free.md"
SHAPE = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
# the examples of each task's train.tsv: (column of the first sentence, of the second or None, header rows)
TASKS = {"SST-2": (0, None, 1), "CoLA": (3, None, 0), "MRPC": (3, 4, 1)}


def read_examples(task: str) -> list[tuple[str, str | None]]:
    first, second, header = TASKS[task]
    with open(GLUE / task / "train.tsv", encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[header:]
    return [(row[first], row[second] if second is not None else None) for row in rows]


def train_tokenizer(vocab_size: int):
    """convattn's own tokenizer (the unigram model `pretrain` and `glue` fit), fitted on the three tasks' text."""
    import datasets

    from convattn.data.tokenizer import train_tokenizer as fit

    text = [s for task in TASKS for pair in read_examples(task) for s in pair if s]
    return fit(datasets.Dataset.from_dict({"text": text}), vocab_size, max_length=128)


def batches(task: str, tokenizer, count: int, size: int, seed: int) -> list[list[dict]]:
    """`count` batches of `size` random training examples (token ids, token types, a label), truncated at 128."""
    examples = read_examples(task)
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        chosen = rng.sample(examples, size)
        encoded = tokenizer(
            [a for a, _ in chosen],
            [b for _, b in chosen] if chosen[0][1] is not None else None,
            truncation=True,
            max_length=128,
            return_token_type_ids=True,
        )
        out.append(
            [
                {"input_ids": ids, "token_type_ids": types, "labels": rng.randrange(2)}
                for ids, types in zip(encoded["input_ids"], encoded["token_type_ids"], strict=True)
            ]
        )
    return out


def padded(features: list[dict]) -> dict:
    n = max(len(f["input_ids"]) for f in features)
    batch = {
        key: torch.zeros(len(features), n, dtype=torch.long)
        for key in ("input_ids", "token_type_ids", "attention_mask")
    }
    for row, f in enumerate(features):
        length = len(f["input_ids"])
        batch["input_ids"][row, :length] = torch.tensor(f["input_ids"])
        batch["token_type_ids"][row, :length] = torch.tensor(f["token_type_ids"])
        batch["attention_mask"][row, :length] = 1
    batch["labels"] = torch.tensor([f["labels"] for f in features])
    return batch


def flattened(features: list[dict]) -> dict:
    """DataCollatorWithFlattening's input_ids and position_ids; the token types, flattened the same way, and one
    label per example (its labels are token-level; a sequence classifier reads each example's first token)."""
    batch = DataCollatorWithFlattening()([{"input_ids": f["input_ids"]} for f in features])
    batch.pop("labels")
    batch["token_type_ids"] = torch.tensor([t for f in features for t in f["token_type_ids"]])[None]
    batch["labels"] = torch.tensor([f["labels"] for f in features])
    return batch


def build_arms(presets: list[str], vocab_size: int, flattened_arm: bool):
    """name -> (model, layout, padding-free route on?)."""
    arms = {}
    torch.manual_seed(0)
    bert = harness.bert_config(dict(vocab_size=vocab_size, max_position_embeddings=512, **SHAPE), num_labels=2)
    arms["BERT-SDPA"] = (BertForSequenceClassification(bert), "padded", None)
    for preset in presets:
        config = ConvAttnConfig.from_preset(
            f"chang2021-small/{preset}", vocab_size=vocab_size, embedding_size=256, num_labels=2, **SHAPE
        )
        torch.manual_seed(0)
        model = ConvAttnForSequenceClassification(config)
        arms[f"{preset} padded"] = (model, "padded", False)
        arms[f"{preset} padding-free"] = (model, "padded", True)
        if flattened_arm:
            arms[f"{preset} flattened"] = (model, "flattened", True)
    return arms


def step_function(model, optimizer, batch: dict, padding_free: bool | None):
    def step() -> None:
        if padding_free is not None:
            routing.UNPAD_BELOW_REAL_FRACTION = PADDING_FREE if padding_free else PADDED
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


PADDING_FREE = dict(routing.UNPAD_BELOW_REAL_FRACTION)  # the library's default
PADDED = {}  # no device runs padded batches padding-free: today's computation


def measure(task: str, arms: dict, task_batches: list[list[dict]], reps: int) -> dict[str, float]:
    """examples/s of each arm: the sum over the batches of each batch's median step time over `reps` passes. The arms
    take turns step by step, in an order that rotates from batch to batch, so that a busy phase of the machine
    hits every arm alike."""
    layouts = {"padded": [padded(b) for b in task_batches], "flattened": [flattened(b) for b in task_batches]}
    # the Trainer's default optimizer (adamw_torch_fused), which `convattn glue` steps with
    optimizers = {
        name: torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True) for name, (model, _, _) in arms.items()
    }
    for model, _, _ in arms.values():
        model.train()
    names = list(arms)
    seconds = {(name, index): [] for name in names for index in range(len(task_batches))}
    for rep in range(reps + 1):  # the first pass warms up every arm
        for index in range(len(task_batches)):
            turn = (rep * len(task_batches) + index) % len(names)
            for name in names[turn:] + names[:turn]:
                model, layout, padding_free = arms[name]
                step = step_function(model, optimizers[name], layouts[layout][index], padding_free)
                start = time.perf_counter()
                step()
                if rep:
                    seconds[name, index].append(time.perf_counter() - start)
    examples = sum(len(b) for b in task_batches)
    routing.UNPAD_BELOW_REAL_FRACTION = PADDING_FREE
    return {
        name: examples / sum(statistics.median(seconds[name, index]) for index in range(len(task_batches)))
        for name in names
    }


def masked_lm_steps(model, optimizer, batches: list[dict], route: dict):
    def steps() -> None:
        routing.UNPAD_BELOW_REAL_FRACTION = route
        for batch in batches:
            model(**batch, return_logits=False).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return steps


def sweep(presets: list[str], vocab_size: int, fractions: list[float], reps: int, batch_size: int, n: int = 128):
    """Masked-LM steps (forward + backward + AdamW, 15 % of the real tokens scored) on padded (batch, n) batches
    whose real tokens fill about `fraction` of them, padded against padding-free: where the threshold belongs.
    Yields (preset, measured real fraction, padded examples/s, padding-free examples/s)."""
    rng = torch.Generator().manual_seed(0)
    for preset in presets:
        config = ConvAttnConfig.from_preset(f"chang2021-small/{preset}", vocab_size=vocab_size, **SHAPE)
        torch.manual_seed(0)
        model = ConvAttnForMaskedLM(config).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        for fraction in fractions:
            spread = (torch.rand(4, batch_size, generator=rng) * 2 - 1) * n * (1 - fraction)
            lengths = (n * fraction + spread).round().clamp(4, n).long()
            lengths[:, 0] = n
            keep = torch.arange(n)[None, None, :] < lengths[..., None]
            ids = torch.randint(5, vocab_size, keep.shape, generator=rng) * keep
            labels = torch.where(keep & (torch.rand(keep.shape, generator=rng) < 0.15), ids, -100)
            batches = [dict(input_ids=ids[b], attention_mask=keep[b].long(), labels=labels[b]) for b in range(len(ids))]
            # padding-free at every fraction here, whatever the library's threshold
            seconds = harness.time_interleaved(
                {
                    "padded": masked_lm_steps(model, optimizer, batches, PADDED),
                    "padding-free": masked_lm_steps(model, optimizer, batches, {"cpu": 1.0}),
                },
                reps,
            )
            routing.UNPAD_BELOW_REAL_FRACTION = PADDING_FREE
            examples = ids.shape[0] * ids.shape[1]
            yield preset, keep.float().mean().item(), examples / seconds["padded"], examples / seconds["padding-free"]


def real_fraction(task_batches: list[list[dict]]) -> float:
    real = sum(len(f["input_ids"]) for b in task_batches for f in b)
    slots = sum(len(b) * max(len(f["input_ids"]) for f in b) for b in task_batches)
    return real / slots


def main() -> int:
    parser = harness.arguments(__doc__, threads=2)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--presets", nargs="+", default=["absolute", "composite"])
    parser.add_argument("--batches", type=int, default=8, help="distinct batches per task (default 8)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5, help="timed passes through the batches (median; default 5)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--no-flattened", action="store_true", help="leave out the DataCollatorWithFlattening arms")
    parser.add_argument(
        "--sweep",
        type=float,
        nargs="*",
        default=None,
        metavar="FRACTION",
        help="also masked-LM steps on (32, 128) batches this full of real tokens, padded against "
        "padding-free (default fractions with no value: 0.5 0.7 0.8 0.9 0.95)",
    )
    parser.add_argument("--note", default="", help="a line about the machine's state, written with the results")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = train_tokenizer(args.vocab_size)
    arms = build_arms(args.presets, len(tokenizer), not args.no_flattened)
    run = harness.Run("padding_free", machine=harness.machine_line(packages=("torch", "transformers")),
                      batch_size=args.batch_size, batches=args.batches, reps=args.reps, note=args.note)
    with run:
        lines = measure_tasks(args, tokenizer, arms, run)
        if args.sweep is not None:
            lines += sweep_lines(args, len(tokenizer), run)
    return harness.report(args.out, lines)


def measure_tasks(args, tokenizer, arms: dict, run: harness.Run) -> list[str]:
    rows = []
    for task in args.tasks:
        task_batches = batches(task, tokenizer, args.batches, args.batch_size, seed=0)
        rates = measure(task, arms, task_batches, args.reps)
        bert, fraction = rates["BERT-SDPA"], real_fraction(task_batches)
        print(f"{task}: real tokens {fraction:.0%}", file=sys.stderr)
        for name, rate in rates.items():
            print(f"  {name:28s} {rate:8.1f} examples/s  {rate / bert:5.2f}x BERT-SDPA", file=sys.stderr)
            rows.append((task, fraction, name, rate, rate / bert))
            run.add(task=task, real_tokens=round(fraction, 4), arm=name, examples_per_s=round(rate, 2),
                    vs_bert=round(rate / bert, 3))
    lines = [
        "# Padding-free fine-tuning steps against transformers' BERT (SDPA)",
        "",
        f"`{harness.command_line()}`",
        "",
        f"{run.machine}. A step: forward + backward + AdamW (fused) of a "
        f"sequence classifier, train mode, batch {args.batch_size}, {args.batches} batches of real training "
        f"examples per task; each batch's median step time over {args.reps} passes, summed; the arms take turns "
        "step by step in one process, in an order rotating from batch to batch.",
        "",
    ]
    if args.note:
        lines += [args.note, ""]
    lines += ["| task | real tokens | arm | examples/s | x BERT-SDPA |", "|---|---:|---|---:|---:|"]
    return lines + [f"| {task} | {fraction:.0%} | {name} | {rate:.1f} | {ratio:.2f}x |"
                    for task, fraction, name, rate, ratio in rows]


def sweep_lines(args, vocab_size: int, run: harness.Run) -> list[str]:
    fractions = args.sweep or [0.5, 0.7, 0.8, 0.9, 0.95]
    lines = [
        "",
        f"Masked-LM steps on padded ({args.batch_size}, 128) batches by their real-token fraction (lengths drawn "
        "around it, one row full), padded against padding-free, 4 batches a repetition, median of "
        f"{args.reps}; the library runs padded batches padding-free below "
        f"{PADDING_FREE.get('cpu', 0):.0%} real tokens on CPU.",
        "",
        "| preset | real tokens | padded examples/s | padding-free examples/s | padding-free / padded |",
        "|---|---:|---:|---:|---:|",
    ]
    for preset, fraction, padded_rate, free_rate in sweep(args.presets, vocab_size, fractions, args.reps,
                                                          args.batch_size):
        print(f"  sweep {preset} {fraction:.0%}: {free_rate / padded_rate:.2f}x", file=sys.stderr)
        run.add(sweep=preset, real_tokens=round(fraction, 4), padded_examples_per_s=round(padded_rate, 2),
                padding_free_examples_per_s=round(free_rate, 2), padding_free_over_padded=round(
                    free_rate / padded_rate, 3))
        lines.append(f"| {preset} | {fraction:.0%} | {padded_rate:.1f} | {free_rate:.1f} | "
                     f"{free_rate / padded_rate:.2f}x |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
