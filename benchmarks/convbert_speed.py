"""Forward + backward time of convattn's ConvBERT against transformers' ConvBERT and BERT (sdpa).

Three models of the `convbert/small` shape (H 256, E 128, 12 layers, 4 heads, FFN 1024, vocab 30522) in
one process, in training mode (dropout on): convattn `ConvAttnModel` (masked padding), transformers
`ConvBertModel` holding the same weights (outputs checked equal first), and transformers `BertModel`
with sdpa attention at the same hidden size. Each step is forward + sum().backward() on a full batch
(no padding); the models take turns within every repetition so machine load hits them alike, and the
table reports the median over repetitions after warm-up. A second table times the attention module
alone (one layer's mixed attention, where the implementations differ; the rest is the same matmuls).

    python benchmarks/convbert_speed.py                  # n = 128 (batch 8) and 512 (batch 2), 2 threads
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import torch
from transformers import BertModel, ConvBertConfig, ConvBertModel

from convattn.attention import TokenMask
from convattn.interop.convbert import from_transformers

SHAPE = dict(vocab_size=30522, hidden_size=256, num_hidden_layers=12, num_attention_heads=4, intermediate_size=1024,
             max_position_embeddings=512)


def build_models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    hf_convbert = ConvBertModel(ConvBertConfig(**SHAPE, embedding_size=128, head_ratio=2, conv_kernel_size=9,
                                               pad_token_id=0))
    ours = from_transformers(hf_convbert, convbert_padding="masked")
    bert = BertModel(harness.bert_config(SHAPE), add_pooling_layer=False)
    ids = torch.randint(1, SHAPE["vocab_size"], (2, 64))
    with torch.no_grad():
        diff = (ours(input_ids=ids).last_hidden_state - hf_convbert.eval()(input_ids=ids).last_hidden_state).abs().max()
    assert diff < 1e-4, f"convattn and transformers ConvBERT disagree by {diff}"
    return {"convattn ConvBERT": ours.train(), "transformers ConvBERT": hf_convbert.train(),
            "transformers BERT (sdpa)": bert.train()}


def training_step(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=mask).last_hidden_state.sum().backward()

    return step


def attention_step(module: torch.nn.Module, x: torch.Tensor, ours: bool) -> Callable[[], None]:
    mask = TokenMask(torch.ones(x.shape[:2], dtype=torch.bool))

    def step() -> None:
        module.zero_grad(set_to_none=True)
        inputs = x.detach().requires_grad_()
        context, _ = module(inputs, mask) if ours else module(inputs, None)
        context.sum().backward()

    return step


def main() -> None:
    parser = harness.arguments(__doc__, reps=7, threads=2, output="convbert_speed.md")
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--batch", default="8,2", help="batch size for each length")
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(n) for n in args.lengths.split(",")]
    batches = [int(b) for b in args.batch.split(",")]
    if len(batches) != len(lengths):
        parser.error("--batch needs one batch size per length")

    models = build_models()
    names = list(models)
    lines = [
        *harness.heading("ConvBERT speed: forward + backward, `convbert/small` shape"),
        f"Machine: {harness.machine_line()}. Median of {args.reps} repetitions after {args.warmup} warm-up, models "
        "interleaved, training mode, no padding.",
        "",
        "| n | batch | " + " | ".join(f"{name} (ms)" for name in names)
        + " | transformers ConvBERT / convattn | convattn / BERT |",
        "|---|---|" + "---|" * (len(names) + 2),
    ]
    with harness.Run("convbert_speed", reps=args.reps, warmup=args.warmup) as run:
        for n, batch in zip(lengths, batches, strict=True):
            generator = torch.Generator().manual_seed(n)
            ids = torch.randint(1, SHAPE["vocab_size"], (batch, n), generator=generator)
            mask = torch.ones_like(ids)
            steps = {name: training_step(model, ids, mask) for name, model in models.items()}
            medians = harness.time_interleaved(steps, args.reps, args.warmup)
            ours, hf, bert = (medians[name] for name in names)
            run.add(level="model", n=n, batch=batch, ms={name: round(1e3 * medians[name], 2) for name in names},
                    transformers_over_convattn=round(hf / ours, 3), convattn_over_bert=round(ours / bert, 3))
            harness.emit(lines, n, batch, *(f"{1e3 * medians[name]:.1f}" for name in names), f"{hf / ours:.2f}x",
                         f"{ours / bert:.2f}x")
        ours_attention = models[names[0]].encoder.layer[0].attention.self
        hf_attention = models[names[1]].encoder.layer[0].attention.self
        lines += ["", "Attention module alone (layer 0, forward + backward):", "",
                  "| n | batch | convattn (ms) | transformers (ms) | transformers / convattn |",
                  "|---|---|---|---|---|"]
        for n, batch in zip(lengths, batches, strict=True):
            x = torch.randn(batch, n, SHAPE["hidden_size"], generator=torch.Generator().manual_seed(n))
            medians = harness.time_interleaved({"ours": attention_step(ours_attention, x, True),
                                                "hf": attention_step(hf_attention, x, False)}, 3 * args.reps,
                                               args.warmup)
            run.add(level="attention", n=n, batch=batch, ms={name: round(1e3 * value, 3) for name, value in
                                                              medians.items()},
                    transformers_over_convattn=round(medians["hf"] / medians["ours"], 3))
            harness.emit(lines, n, batch, f"{1e3 * medians['ours']:.2f}", f"{1e3 * medians['hf']:.2f}",
                         f"{medians['hf'] / medians['ours']:.2f}x")
    harness.report(args.output, lines)


if __name__ == "__main__":
    main()
