"""Training tokens/s of convattn pretraining against `transformers`' BertForMaskedLM under the same `Trainer`.

convattn trains through its own entry point, as users do (`convattn.training.pretrain.pretrain` with a recipe
from `load_recipe`, `PretrainOptions(compile=...)`); the baseline is `transformers.BertForMaskedLM` of the same
shape and vocabulary (sdpa attention), trained by `transformers.Trainer` with the same batch, optimizer, lr
schedule, precision and `torch_compile`, on the same tokens: the run's own tokenizer and the library's `packed`
layout (full blocks of seq_len tokens, so every batch has one shape and no padding) of the same text, masked by
`DataCollatorForLanguageModeling` at 15 %. convattn's embedding size is set to the hidden size, as BERT's is.

Throughput = batch x seq_len tokens over the median step time after the warm-up (compilation and the first
steps' allocations), timed by the same Trainer callback on both sides. Each (precision, compile) setting runs
every convattn preset, then BERT, in the same process; ratios > 1 mean convattn trains faster. Results go to
benchmarks/results/train_throughput.md (train_throughput_cuda.md with --device cuda).

    python benchmarks/train_throughput.py --compile                # CPU: L 4, H 256, batch 8 x 128, 16 steps,
                                                                   # vocabulary 8,000 from WikiText-103 valid
    python benchmarks/train_throughput.py --device cuda --compile  # GPU: BERT-small (L 12, H 256, 4 heads,
                                                                   # I 1024), batch 128 x 128, 60 steps,
                                                                   # vocabulary 30,004 from enwiki-2015-sample/
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

import harness
import torch
from transformers import AutoTokenizer, BertForMaskedLM

from convattn.data.corpus import load_corpus
from convattn.data.formatting import format_dataset
from convattn.training.pretrain import PretrainOptions, pretrain
from convattn.training.recipes import load_recipe

DATA = harness.DATA
BERT = "transformers BertForMaskedLM"
# per device: (layers, hidden, heads, intermediate, batch, steps, warm-up steps, vocabulary, text); the GPU's is
# BERT-small with the paper's vocabulary, which needs more text than WikiText-103 valid (11,386 pieces from it)
DEFAULTS = {
    "cpu": (4, 256, 4, 1024, 8, 16, 4, 8000, DATA / "wikitext-103-raw" / "wiki.valid.raw"),
    "cuda": (12, 256, 4, 1024, 128, 60, 20, 30004, DATA / "enwiki-2015-sample"),
}


def recipe_for(preset: str, args):
    return dataclasses.replace(
        load_recipe("chang2021-small"), preset=preset, format="packed", vocab_size=args.vocab_size,
        seq_len=args.seq_len, batch_size=args.batch_size, max_steps=args.steps, warmup=0.1,
        eval_every=args.steps, save_every=args.steps, eval_samples=args.batch_size,
        model=dict(num_hidden_layers=args.layers, hidden_size=args.hidden, embedding_size=args.hidden,
                   num_attention_heads=args.heads, intermediate_size=args.intermediate),
    )


def clock(args):
    """The step meter of both sides: every step's end, for the median step after the warm-up."""
    return harness.step_meter(args.warmup_steps, args.steps - args.warmup_steps, every_step=True)


def run_convattn(preset: str, precision: str, mode: str | None, args, work: Path) -> tuple[dict, Path]:
    meter = clock(args)
    out = Path(tempfile.mkdtemp(dir=work, prefix="convattn-"))
    options = PretrainOptions(recipe=recipe_for(preset, args), output_dir=out, train_files=[str(args.train_file)],
                              tokenizer=str(args.tokenizer) if args.tokenizer else None, cache_dir=work / "cache",
                              precision=precision, compile=mode, log_every=args.steps)
    pretrain(options, callbacks=[meter])
    return meter.steady(args.batch_size * args.seq_len), out


def bert_dataset(tokenizer, args, work: Path):
    """The examples convattn trained on: the same corpus split, tokenizer and packed layout."""
    corpus = load_corpus(None, None, [str(args.train_file)], [], work / "cache")
    return format_dataset(corpus.train, tokenizer, "packed", args.seq_len)


def run_bert(tokenizer, dataset, precision: str, mode: str | None, args, work: Path) -> dict:
    recipe = recipe_for("chang2021-small/absolute", args)
    config = harness.bert_config(dict(vocab_size=len(tokenizer), hidden_size=args.hidden, num_hidden_layers=args.layers,
                                      num_attention_heads=args.heads, intermediate_size=args.intermediate,
                                      max_position_embeddings=max(args.seq_len, 128)),
                                 pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(recipe.seed)
    model = BertForMaskedLM(config)
    meter = clock(args)
    harness.bert_trainer(
        model, tokenizer, dataset, work / "bert", steps=recipe.max_steps, batch=recipe.batch_size,
        precision=precision, compile_mode=mode, seed=recipe.seed, callbacks=[meter],
        mlm_probability=recipe.mlm_probability, learning_rate=recipe.learning_rate, weight_decay=recipe.weight_decay,
        adam_epsilon=recipe.adam_epsilon, adam_beta1=recipe.adam_beta1, adam_beta2=recipe.adam_beta2,
        warmup_steps=recipe.warmup, max_grad_norm=recipe.max_grad_norm).train()
    return meter.steady(args.batch_size * args.seq_len)


def measure(args, work: Path) -> list[dict]:
    """Every (precision, mode) setting: each convattn preset, then BERT; repeated, medians kept."""
    modes = [None, "default"] if args.compile else [None]  # torch.compile's mode (None: eager)
    samples: dict[tuple, list[dict]] = {}
    tokenizer = dataset = None
    for repeat in range(args.repeats):
        for precision in args.precisions:
            for mode in modes:
                ours = {}
                for preset in args.presets:
                    torch._dynamo.reset()  # a fresh model each run: no recompile limit, no stale graphs
                    ours[preset], out = run_convattn(preset, precision, mode, args, work)
                    if tokenizer is None:  # the tokenizer the runs trained (cached: every run has the same)
                        tokenizer = AutoTokenizer.from_pretrained(out)
                        dataset = bert_dataset(tokenizer, args, work)
                        args.vocabulary = len(tokenizer)
                torch._dynamo.reset()
                results = {BERT: run_bert(tokenizer, dataset, precision, mode, args, work), **ours}
                for model, row in results.items():
                    key = (precision, "compiled" if mode else "eager", model)
                    samples.setdefault(key, []).append(row)
                    print(f"[{repeat + 1}/{args.repeats}] {precision} {key[1]:8s} {model:32s} "
                          f"{row['tokens_per_second']:9,.0f} tokens/s  warm-up {row['warmup_seconds']:.1f} s",
                          flush=True)
    rows = []
    for (precision, mode, model), runs in samples.items():
        rows.append({"precision": precision, "mode": mode, "model": model,
                     "tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs),
                     "warmup_seconds": statistics.median(r["warmup_seconds"] for r in runs)})
    return rows


def ratio_table(rows: list[dict]) -> list[str]:
    bert = {(r["precision"], r["mode"]): r["tokens_per_second"] for r in rows if r["model"] == BERT}
    eager = {(r["precision"], r["model"]): r["tokens_per_second"] for r in rows if r["mode"] == "eager"}
    lines = ["| precision | mode | model | tokens/s | / BERT, same setting | / own eager | warm-up s |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        own = r["tokens_per_second"] / eager[r["precision"], r["model"]]
        lines.append(f"| {r['precision']} | {r['mode']} | {r['model']} | {r['tokens_per_second']:,.0f} | "
                     f"{r['tokens_per_second'] / bert[r['precision'], r['mode']]:.2f} | {own:.2f} | "
                     f"{r['warmup_seconds']:.1f} |")
    return lines


def report(rows: list[dict], args) -> str:
    return "\n".join([
        *harness.heading("Training throughput: convattn pretraining vs transformers BertForMaskedLM (same Trainer)"),
        f"Machine: {machine(args.device)}.  ",
        f"Shape: L {args.layers}, H {args.hidden} (convattn embedding size = H, as BERT), {args.heads} heads, "
        f"I {args.intermediate}, seq len {args.seq_len}, batch {args.batch_size}, vocabulary {args.vocabulary:,} "
        f"(unigram trained on the text, --vocab-size {args.vocab_size}); {args.steps} steps, the first "
        f"{args.warmup_steps} left out as warm-up; median of {args.repeats} repetition(s). Data: packed blocks of "
        f"`{args.train_file.name}`, 15 % masked.",
        "",
        "tokens/s = batch x seq len / the median time of the steps after the warm-up; `/ BERT` is against "
        "BertForMaskedLM (sdpa) in the same precision and mode, run in the same process; warm-up s = the time of "
        "the warm-up steps (compilation included; convattn's evaluation at step 0 left out). The MLM head runs at "
        "the masked positions only in convattn (eager: exactly those; compiled: a fixed quarter of the positions, "
        "the masked ones first), at every position in BERT.",
        "",
        *ratio_table(rows),
        "",
    ])


def parse_args():
    parser = harness.arguments(__doc__)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--compile", action="store_true", help="also measure torch.compile'd training (inductor)")
    parser.add_argument("--precisions", default=None, help="comma-separated; default fp32,bf16 where supported")
    parser.add_argument("--presets", default="chang2021-small/absolute,chang2021-small/composite")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--intermediate", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--warmup-steps", type=int, help="steps left out of the throughput (compilation)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, help="of the trained tokenizer (a small text gives fewer pieces)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (CPU device only)")
    parser.add_argument("--train-file", type=Path, help="text file or folder")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer directory instead of one trained on the text "
                        "(e.g. .gpu-kit/tokenizer on a GPU machine, see benchmarks/gpu.sh)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    names = ("layers", "hidden", "heads", "intermediate", "batch_size", "steps", "warmup_steps", "vocab_size",
             "train_file")
    for name, value in zip(names, DEFAULTS[args.device], strict=True):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU here")
    if args.precisions is None:
        bf16 = args.device == "cpu" or torch.cuda.is_bf16_supported()
        args.precisions = "fp32,bf16" if bf16 else "fp32"
    args.precisions = args.precisions.split(",")
    args.presets = args.presets.split(",")
    results = Path(__file__).parent / "results"
    args.output = args.output or results / ("train_throughput_cuda.md" if args.device == "cuda" else
                                            "train_throughput.md")
    return args


def machine(device: str) -> str:
    return harness.machine_line(device, packages=("torch", "transformers"))


def main() -> int:
    args = parse_args()
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    with (harness.Run("train_throughput", machine=machine(args.device), steps=args.steps,
                      warmup_steps=args.warmup_steps, repeats=args.repeats) as run,
          tempfile.TemporaryDirectory(prefix="train-throughput-") as work):
        rows = measure(args, Path(work))
        run.figures += rows
    harness.report(args.output, report(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
