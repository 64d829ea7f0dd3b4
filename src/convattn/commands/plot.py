"""`convattn plot ...`: figures of what a trained model's convolutions and attention do."""

from __future__ import annotations

import argparse
from pathlib import Path

from convattn.errors import UsageError

DEFAULT_TEXT = ("The quick brown fox jumps over the lazy dog, and the dog, which had been asleep, "
                "did not notice that anything had happened.")


def register(subparsers) -> None:
    plot = subparsers.add_parser("plot", help="plot learned kernels and attention maps of a checkpoint",
                                 description="Figures (PNG) of what a trained model's convolutions and attention do.")
    kinds = plot.add_subparsers(dest="plot_kind", metavar="KIND")
    kinds.required = True

    kernels = kinds.add_parser(
        "kernels", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="fixed lightweight kernels (Chang et al. Fig. 2), depthwise kernels (Fig. 3), dynamic kernels",
        description="Heatmaps of the learned lightweight-convolution kernels beta per layer and head, the depthwise "
                    "value kernels per channel sorted by previous/next-token preference, and the dynamic "
                    "(query-based) kernels averaged over the tokens of a text.",
    )
    kernels.add_argument("checkpoint", help="saved model directory (e.g. the output of `convattn pretrain`)")
    kernels.add_argument("--text", default=DEFAULT_TEXT, help="text over which dynamic kernels are averaged")
    kernels.add_argument("--layer", type=int, default=-1, help="layer of the depthwise kernels (-1: deepest)")
    kernels.add_argument("--output-dir", type=Path, default=None, help="where PNGs go (default: CHECKPOINT/plots)")
    kernels.set_defaults(func=run_kernels)

    attention = kinds.add_parser(
        "attention", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="average attention map per layer for a text",
        description="The softmax attention of each layer, averaged over its self-attention heads, for one text.",
    )
    attention.add_argument("checkpoint", help="saved model directory with its tokenizer")
    attention.add_argument("--text", default=DEFAULT_TEXT, help="the text to encode")
    attention.add_argument("--output-dir", type=Path, default=None, help="where PNGs go (default: CHECKPOINT/plots)")
    attention.set_defaults(func=run_attention)


def _output_dir(args) -> Path:
    return args.output_dir or Path(args.checkpoint) / "plots"


def _encode(checkpoint: str, text: str, max_length: int):
    from convattn.analysis.io import load_tokenizer

    tokenizer = load_tokenizer(checkpoint)
    encoded = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_length)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    return encoded, tokens


def run_kernels(args: argparse.Namespace) -> int:
    from convattn.analysis.io import load_encoder
    from convattn.analysis.kernels import (
        depthwise_kernels,
        dynamic_kernels,
        fixed_kernels,
        plot_depthwise_kernels,
        plot_layer_head_kernels,
    )

    model = load_encoder(args.checkpoint)
    out, written = _output_dir(args), []
    fixed = fixed_kernels(model)
    if fixed is not None:
        written.append(plot_layer_head_kernels(fixed, "Fixed lightweight convolution kernels β",
                                               out / "fixed_kernels.png"))
    depthwise = depthwise_kernels(model, args.layer)
    if depthwise is not None:
        layer = args.layer % model.config.num_hidden_layers
        written.append(plot_depthwise_kernels(depthwise, f"Depthwise value kernels, layer {layer}",
                                              out / "depthwise_kernels.png"))
    if model.config.relative_terms and "dynamic_query" in model.config.relative_terms:
        encoded, _ = _encode(args.checkpoint, args.text, model.config.max_position_embeddings)
        dynamic = dynamic_kernels(model, encoded["input_ids"], encoded["attention_mask"])
        written.append(plot_layer_head_kernels(dynamic, "Dynamic kernels q·W/√d, mean over the text's tokens",
                                               out / "dynamic_kernels.png"))
    if not written:
        raise UsageError(f"{args.checkpoint} has no lightweight or depthwise convolution kernels to plot "
                         "(relative_terms and value_depthwise_conv are off)")
    for path in written:
        print(path)
    return 0


def run_attention(args: argparse.Namespace) -> int:
    from convattn.analysis.attention_maps import attention_maps, plot_attention_maps
    from convattn.analysis.io import load_encoder

    model = load_encoder(args.checkpoint)
    encoded, tokens = _encode(args.checkpoint, args.text, model.config.max_position_embeddings)
    maps = attention_maps(model, encoded["input_ids"])
    path = plot_attention_maps(maps, tokens, "Attention per layer (mean over self-attention heads)",
                               _output_dir(args) / "attention_maps.png")
    print(path)
    return 0
