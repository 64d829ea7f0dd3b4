"""Each run of a `convattn compare` grid: its whole masked-LM training step at a compare command's shape, every run
in one process, taking turns within every repetition, so that each run's cost per step and its ratio to a baseline
run are the models' own, not the load the machine had while `compare` trained them one after another.

The step is the pretraining one: the model of the run's preset with the command's size fields, forward with the
loss at the masked tokens alone (as `convattn pretrain` computes it), backward, gradient clipping at 1.0 and fused
AdamW, in training mode (dropout on). With --train-file and --tokenizer the batches are the run's own kind: lines of
the corpus in the recipe's format (the position study's: pairs of lines, cut to --seq-len, padded to a multiple of 8)
masked by the pretraining collator, the same --batches batches for every run in turn. Their padding matters: a
sixth of the study's tokens are pads, and ConvBERT's step costs 0.88x composite+key's on them against 0.81x on full
rows of random ids (the default without them: 1/8 of one row padded). How OpenMP's threads wait matters more: they
wait as the environment says (the command line's runs: GOMP_SPINCOUNT=1000 unless a time budget's compute clock
counts, then OMP_WAIT_POLICY=PASSIVE, under which the same ratios are 1.07x and 0.86x; benchmarks/thread_wait.py).
Results go to benchmarks/results/<output>.md, the costs by run to the same name's .json
(`benchmarks/paired_comparison.py --costs` reads it) and a row to step_cost.jsonl.

    # the position study's shape (RESULTS 6.5), threads waiting as `convattn pretrain --max-steps` makes them
    GOMP_SPINCOUNT=1000 python benchmarks/step_cost.py --grid positions --layers 2 --hidden 128 --heads 4 \\
        --intermediate 512 --batch-size 32 --seq-len 128 --tokenizer benchmarks/results/compare-positions/tokenizer \\
        --train-file ../shared/data/enwiki-2015-sample/ --output step_cost_positions.md
    # as the study's runs waited (every command slept at once before 2026-11-29)
    OMP_WAIT_POLICY=PASSIVE python benchmarks/step_cost.py ... --output step_cost_positions_sleeping.md
"""

from __future__ import annotations

import itertools
import json
import os
import random

import harness
import torch

from convattn import ConvAttnConfig
from convattn.commands.arguments import ARCHITECTURE_FLAGS
from convattn.files import write_text_atomic
from convattn.model import ConvAttnForMaskedLM
from convattn.training.compare.grids import load_grid
from convattn.training.recipes import load_recipe

MLM_PROBABILITY = 0.15


def random_batches(vocab_size: int, batch: int, n: int, seed: int = 0) -> list[dict]:
    """One batch of random ids, the last 1/8 of its first row padded, 15 % of its real tokens labelled."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (batch, n), generator=generator)
    keep = harness.padded_keep(batch, n, dtype=torch.long)
    labelled = (torch.rand(batch, n, generator=generator) < MLM_PROBABILITY) & keep.bool()
    return [{"input_ids": ids, "attention_mask": keep, "labels": torch.where(labelled, ids, -100)}]


def corpus_batches(train_file: str, tokenizer_dir: str, layout: str, batch: int, n: int, count: int,
                   seed: int = 0) -> tuple[list[dict], int]:
    """`count` batches as `convattn pretrain` makes them (the corpus's lines formatted, in a seeded order, masked by
    its collator), and the tokenizer's vocabulary size. A few times the lines the batches need are formatted."""
    from convattn.data.corpus import load_corpus
    from convattn.data.formatting import format_dataset
    from convattn.data.tokenizer import load_tokenizer
    from convattn.training.pretrain.data import MaskingCollator
    from convattn.training.pretrain.options import default_cache_dir

    tokenizer = load_tokenizer(tokenizer_dir)
    lines = load_corpus(None, None, [train_file], [], default_cache_dir()).train
    # consecutive lines from a seeded place (pairs join neighbours, as over the whole corpus), examples shuffled
    wanted = min(len(lines), 8 * batch * count)
    start = random.Random(seed).randrange(len(lines) - wanted + 1)
    examples = format_dataset(lines.select(range(start, start + wanted)), tokenizer, layout, n).shuffle(seed=seed)
    if len(examples) < batch * count:
        raise SystemExit(f"--train-file {train_file}: {len(examples)} examples, fewer than --batches x --batch-size")
    collate = MaskingCollator(tokenizer, MLM_PROBABILITY, seed)
    batches = [collate([examples[i] for i in range(start, start + batch)])
               for start in range(0, batch * count, batch)]
    return [{name: value for name, value in b.items() if torch.is_tensor(value)} for b in batches], len(tokenizer)


def build(preset: str, fields: dict, batches: list[dict], seed: int = 0):
    """One run's training step (a function: each call takes the next of `batches`) and the model it trains."""
    config = ConvAttnConfig.from_preset(preset, **fields)
    torch.manual_seed(seed)
    model = ConvAttnForMaskedLM(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, eps=1e-6, fused=True)
    turn = itertools.count()

    def step():
        inputs = batches[next(turn) % len(batches)]
        loss = model(**inputs, return_logits=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, model


def encoder_parameters(model) -> int:
    """The parameters without the pretraining head (compare's "encoder params")."""
    return sum(p.numel() for name, p in model.named_parameters() if not name.startswith("mlm_head"))


def add_size_flags(parser, **defaults) -> None:
    """--layers, --hidden, --heads, --intermediate (the presets' own where not given, unless `defaults` says),
    --batch-size and --seq-len, as `convattn compare` takes them."""
    for flag in ("layers", "hidden", "heads", "intermediate"):
        parser.add_argument(f"--{flag}", type=int, default=defaults.get(flag))
    parser.add_argument("--batch-size", type=int, default=defaults.get("batch_size", 32))
    parser.add_argument("--seq-len", type=int, default=defaults.get("seq_len", 128))


def size_fields(args) -> dict:
    """The config fields the command's size flags set, as `convattn compare` sets them for every run."""
    fields = {ARCHITECTURE_FLAGS[flag]: getattr(args, flag) for flag in ("layers", "hidden", "heads", "intermediate")}
    return {name: value for name, value in {**fields, "vocab_size": args.vocab_size}.items() if value is not None}


def main() -> int:
    parser = harness.arguments(__doc__, reps=30, threads=2, output="step_cost.md")
    parser.add_argument("--grid", default="positions", help="a shipped grid (convattn compare --grid)")
    parser.add_argument("--baseline", default="absolute",
                        help="the run every ratio divides by (its name after the preset family's '/')")
    parser.add_argument("--runs", help="comma-separated run names to time (default: the grid's every run)")
    add_size_flags(parser)
    parser.add_argument("--vocab-size", type=int, default=8000, help="random ids' vocabulary (without --tokenizer)")
    parser.add_argument("--train-file", help="a corpus file or folder, as `convattn pretrain --train-file` takes it")
    parser.add_argument("--tokenizer", help="the runs' tokenizer (a folder); with --train-file")
    parser.add_argument("--batches", type=int, default=8, help="how many corpus batches the runs cycle through")
    args = parser.parse_args()
    if bool(args.train_file) != bool(args.tokenizer):
        parser.error("--train-file and --tokenizer go together (the batches are the corpus's, in the tokenizer's ids)")
    torch.set_num_threads(args.threads)
    grid = load_grid(args.grid)
    runs = {spec.name.split("/")[-1]: spec for spec in grid.runs}
    chosen = args.runs.split(",") if args.runs else list(runs)
    unknown = sorted({*chosen, args.baseline} - set(runs))
    if unknown:
        parser.error(f"--runs/--baseline: grid {args.grid} has no run {', '.join(unknown)} "
                     f"(it has {', '.join(runs)})")
    chosen = [args.baseline] + [name for name in chosen if name != args.baseline]
    if args.train_file:
        layout = load_recipe(grid.recipe or "chang2021-small").format
        batches, args.vocab_size = corpus_batches(args.train_file, args.tokenizer, layout, args.batch_size,
                                                  args.seq_len, args.batches)
        real = sum(int(b["attention_mask"].sum()) for b in batches) / sum(b["attention_mask"].numel() for b in batches)
        inputs = (f"{args.batches} batches of {args.train_file} ({layout}), {real:.0%} of their tokens real, the "
                  f"tokenizer {args.tokenizer}")
    else:
        batches = random_batches(args.vocab_size, args.batch_size, args.seq_len)
        inputs = "random ids, the last 1/8 of one row padded"
    fields = {**grid.model, **size_fields(args), "max_position_embeddings": max(args.seq_len, 128)}
    steps, params = {}, {}
    for name in chosen:
        spec = runs[name]
        steps[name], model = build(spec.preset, {**fields, **spec.model}, batches)
        params[name] = encoder_parameters(model)
    shape = f"batch {args.batch_size} x {args.seq_len} tokens; {inputs}"
    waiting = {name: os.environ.get(name, "unset") for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    with harness.Run("step_cost", grid=args.grid, fields=fields, shape=shape, threads=args.threads,
                     openmp=waiting) as run:
        spreads = harness.spreads(steps, args.reps, warmup=2)
        base = spreads[args.baseline].median
        costs = {}
        for name in chosen:
            spread = spreads[name]
            costs[name] = {"seconds_per_step": spread.median, "ratio": spread.median / base,
                           "least": spread.least, "most": spread.most, "encoder_params": params[name]}
            run.add(run=name, **costs[name])
    lines = harness.heading(
        f"Training step of each run of the grid `{args.grid}`", f"Machine: {harness.machine_line()}  ",
        f"Config fields for every run: `{json.dumps(fields)}`; {shape}; {args.reps} repetitions after 2 warm-up "
        "ones, the runs taking turns within each; OpenMP's waiting: "
        + ", ".join(f"{name} {value}" for name, value in waiting.items()) + ".", "",
        f"| run | encoder params | ms per step: median [least, most] | x {args.baseline} |", "|---|---:|---:|---:|")
    for name, cost in costs.items():
        lines.append(f"| {name} | {cost['encoder_params'] / 1e6:.2f}M | {cost['seconds_per_step'] * 1e3:,.0f} "
                     f"[{cost['least'] * 1e3:,.0f}, {cost['most'] * 1e3:,.0f}] | {cost['ratio']:.2f} |")
    harness.report(args.output, lines)
    payload = {"grid": args.grid, "baseline": args.baseline, "shape": shape, "fields": fields, "openmp": waiting,
               "command": harness.command_line(), "commit": harness.commit(), "costs": costs}
    write_text_atomic(args.output.with_suffix(".json"), json.dumps(payload, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
