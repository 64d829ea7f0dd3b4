"""`convattn plot ...`: figures of what a trained model's convolutions and attention do, and a kernel-size sweep."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from convattn.commands.arguments import HelpFormatter, add_verbose_argument, user_path
from convattn.errors import UsageError

DEFAULT_KERNEL_SIZES = "1,3,5,7,9,13,17"
KERNEL_SIZE_EXAMPLES = """\
examples:
  convattn plot kernel-size --layers 2 --hidden 128 --intermediate 512 --vocab-size 8000 --batch-size 32 \\
      --max-steps 300 --seeds 2
      the default sizes on the embedded corpus, scaled down
  convattn plot kernel-size --kernel-sizes 3,9,17 --train-file wiki/ --eval-file valid.txt \\
      --glue sst2 --glue-data-dir glue_data --glue-max-steps 300
      three sizes, with SST-2 dev accuracy as a second panel

Writes kernel_size.png and the full `convattn compare` report (report.md, perplexity.png, CSVs) to OUTPUT_DIR;
run the same command again to continue (finished runs are reused).
"""
DEFAULT_TEXT = ("The quick brown fox jumps over the lazy dog, and the dog, which had been asleep, "
                "did not notice that anything had happened.")


NAME = "plot"
HELP = (
    "plot learned kernels and attention maps of a checkpoint, or sweep "
    "ConvBERT's kernel size"
)
DESCRIPTION = (
    "Figures (PNG) of what a trained model's convolutions and attention do, "
    "and ConvBERT's kernel-size sweep."
)


def add_arguments(plot: argparse.ArgumentParser) -> None:
    kinds = plot.add_subparsers(dest="plot_kind", metavar="KIND")
    kinds.required = True

    kernels = kinds.add_parser(
        "kernels", formatter_class=HelpFormatter,
        help="fixed lightweight kernels (Chang et al. Fig. 2), depthwise kernels (Fig. 3), dynamic kernels",
        description="Heatmaps of the learned lightweight-convolution kernels beta per layer and head, the depthwise "
                    "value kernels per channel sorted by previous/next-token preference, and the dynamic "
                    "(query-based) kernels averaged over the tokens of a text.",
    )
    kernels.add_argument("checkpoint", type=os.path.expanduser,
                         help="saved model directory (e.g. the output of `convattn pretrain`)")
    kernels.add_argument("--text", default=DEFAULT_TEXT, help="text over which dynamic kernels are averaged")
    kernels.add_argument("--layer", type=int, default=-1, help="layer of the depthwise kernels (-1: deepest)")
    kernels.add_argument("--output-dir", type=user_path, default=None, help="where PNGs go (default: CHECKPOINT/plots)")
    add_verbose_argument(kernels)
    kernels.set_defaults(func=run_kernels)

    attention = kinds.add_parser(
        "attention", formatter_class=HelpFormatter,
        help="average attention map per layer for a text (ConvBERT: also its per-token conv kernels)",
        description="The softmax attention of each layer, averaged over its self-attention heads, for one text "
                    "(attention_maps.png). For ConvBERT models also the span-based dynamic convolution kernel of "
                    "each token, averaged over the conv heads and placed at the positions it weighs "
                    "(convbert_kernels.png; Jiang et al. 2020, Figure 2 style).",
    )
    attention.add_argument("checkpoint", type=os.path.expanduser, help="saved model directory with its tokenizer")
    attention.add_argument("--text", default=DEFAULT_TEXT, help="the text to encode")
    attention.add_argument("--layer", type=int, default=None,
                           help="plot this layer only (negative counts from the deepest; default: every layer)")
    attention.add_argument("--output-dir", type=user_path, default=None,
                           help="where PNGs go (default: CHECKPOINT/plots)")
    add_verbose_argument(attention)
    attention.set_defaults(func=run_attention)

    register_kernel_size(kinds)


def register_kernel_size(kinds) -> None:
    from convattn.commands.arguments import add_run_arguments

    sweep = kinds.add_parser(
        "kernel-size", formatter_class=HelpFormatter, epilog=KERNEL_SIZE_EXAMPLES,
        help="pretrain ConvBERT with several conv kernel sizes and plot perplexity vs size (Jiang et al. Fig. 5)",
        description="Pretrain a ConvBERT preset once per convolution kernel size (span-based dynamic convolution "
                    "and its separable key convolution), with `convattn compare`'s machinery: one tokenizer, the "
                    "same data, budget and seeds, resumable. Then plot the final eval perplexity (and, with "
                    "--glue, the mean GLUE dev score) against the kernel size.",
    )
    what = sweep.add_argument_group("what to sweep")
    what.add_argument("--preset", default="chang2021-small/convbert",
                      help="a ConvBERT preset (head_ratio > 1), e.g. convbert/small")
    what.add_argument("--kernel-sizes", default=DEFAULT_KERNEL_SIZES, metavar="K1,K2,...",
                      help="odd kernel sizes, comma-separated")
    add_run_arguments(sweep, default_output="runs/kernel-size-PRESET")
    sweep.set_defaults(func=run_kernel_size, field_flags={"conv_kernel_size": "--kernel-sizes"})


def _output_dir(args) -> Path:
    from convattn.runs.plots import PLOTS_DIR

    return args.output_dir or Path(args.checkpoint) / PLOTS_DIR


def _check_output_dir(args) -> None:
    """A given --output-dir exists or can be made (not a file), checked before the model is loaded (the default,
    CHECKPOINT/plots, is checked with the checkpoint); a folder holding files other than plot's figures is
    refused, naming them."""
    from convattn.runs.folder import check_output_folder

    if args.output_dir is not None:
        check_output_folder(args.output_dir, "--output-dir")
    _check_own_files(_output_dir(args))


def _check_own_files(out: Path) -> None:
    from convattn.runs.folder import check_only_own_files
    from convattn.runs.plots import foreign_files

    check_only_own_files(out, foreign_files(out), "--output-dir",
                         "files that are not convattn plot's figures")


@contextmanager
def _writing(args) -> Iterator[Path]:
    """The output folder, this process's (the lock every writing command takes) and checked again under the lock,
    while the figures are drawn into it."""
    from convattn.runs.folder import run_folder_lock

    out = _output_dir(args)
    with run_folder_lock(out, "--output-dir"):
        _check_own_files(out)
        yield out
        _log_to_output_dir(args)


def _log_to_output_dir(args) -> None:
    from convattn.console import log_to

    log_to(_output_dir(args))


def _encode(checkpoint: str, text: str, config):
    """The text as the model's ids, with the tokenizer saved beside it (checked against the model first). A text
    longer than the model's positions is cut to them, and how many tokens were cut is said in one line."""
    from convattn.checkpoint import check_tokenizer_fits
    from convattn.console import say
    from convattn.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(checkpoint, flag="checkpoint")  # the positional argument, as load_encoder names it
    check_tokenizer_fits(tokenizer, config, f"checkpoint {checkpoint}")
    max_length = config.max_position_embeddings
    encoded = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_length)
    whole = len(tokenizer(text, verbose=False)["input_ids"])
    if whole > max_length:
        say("plot", f"--text has {whole} tokens, more than the model's {max_length} positions: the figures show "
                    f"its first {max_length} ({whole - max_length} tokens cut); give a shorter --text to see it "
                    "whole")
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

    _check_output_dir(args)
    model = load_encoder(args.checkpoint)
    check_layer(args.layer, model.config.num_hidden_layers)  # before any figure is written
    fixed = fixed_kernels(model)
    depthwise = depthwise_kernels(model, args.layer)
    dynamic = None
    if model.config.relative_terms and "dynamic_query" in model.config.relative_terms:
        encoded, _ = _encode(args.checkpoint, args.text, model.config)
        dynamic = dynamic_kernels(model, encoded["input_ids"], encoded["attention_mask"])
    if fixed is None and depthwise is None and dynamic is None:
        raise UsageError(f"{args.checkpoint} has no lightweight or depthwise convolution kernels to plot "
                         "(relative_terms and value_depthwise_conv are off)")
    written = []
    with _writing(args) as out:
        if fixed is not None:
            written.append(plot_layer_head_kernels(fixed, "Fixed lightweight convolution kernels β",
                                                   out / "fixed_kernels.png"))
        if depthwise is not None:
            layer = args.layer % model.config.num_hidden_layers
            written.append(plot_depthwise_kernels(depthwise, f"Depthwise value kernels, layer {layer}",
                                                  out / "depthwise_kernels.png"))
        if dynamic is not None:
            written.append(plot_layer_head_kernels(dynamic, "Dynamic kernels q·W/√d, mean over the text's tokens",
                                                   out / "dynamic_kernels.png"))
    for path in written:
        print(path)
    return 0


def check_layer(layer: int | None, layers: int) -> None:
    if layer is not None and not -layers <= layer < layers:
        raise UsageError(f"--layer {layer} is out of range: the model has {layers} layers (0..{layers - 1}, "
                         "or negative from the deepest)")


def _select_layer(per_layer: dict, layer: int | None, layers: int) -> dict:
    check_layer(layer, layers)
    if layer is None:
        return per_layer
    index = layer % layers
    return {index: per_layer[index]} if index in per_layer else {}


def run_attention(args: argparse.Namespace) -> int:
    from convattn.analysis.attention_maps import attention_maps, plot_attention_maps, plot_token_matrices
    from convattn.analysis.convbert_kernels import position_kernels
    from convattn.analysis.io import load_encoder

    _check_output_dir(args)
    model = load_encoder(args.checkpoint)
    layers = model.config.num_hidden_layers
    encoded, tokens = _encode(args.checkpoint, args.text, model.config)
    maps = _select_layer(attention_maps(model, encoded["input_ids"]), args.layer, layers)
    kernels = _select_layer(position_kernels(model, encoded["input_ids"]), args.layer, layers)
    written = []
    with _writing(args) as out:
        if maps:
            written.append(plot_attention_maps(maps, tokens, "Attention per layer (mean over self-attention heads)",
                                               out / "attention_maps.png"))
        if kernels:
            k = model.config.conv_kernel_size
            written.append(plot_token_matrices(
                kernels, tokens, f"Span-based dynamic convolution kernels per token (K={k}, mean over conv heads)",
                out / "convbert_kernels.png", xlabel="token j (the kernel tap is j − i)", ylabel="token i",
                colorbar="kernel weight"))
    for path in written:
        print(path)
    return 0


def parse_kernel_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--kernel-sizes {text!r} must be comma-separated odd integers, e.g. 3,5,9") from None
    bad = [k for k in sizes if k < 1 or k % 2 == 0]
    if not sizes or bad:
        raise UsageError(f"--kernel-sizes {text!r}: give odd sizes of at least 1 (the kernel is centred on each "
                         "token), e.g. 1,3,5,9")
    if len(set(sizes)) < len(sizes):
        raise UsageError(f"--kernel-sizes {text!r} lists a size more than once")
    return sorted(sizes)


def run_kernel_size(args: argparse.Namespace) -> int:
    from convattn.commands.compare_flags import compare_options
    from convattn.commands.training_process import prepare_training_process
    from convattn.console import main_process
    from convattn.runs.folder import run_folder_lock
    from convattn.training.compare.grids import RunSpec
    from convattn.training.compare.job import compare_and_report
    from convattn.training.compare.kernel_size import kernel_size_grid, plot_sweep

    sizes = parse_kernel_sizes(args.kernel_sizes)
    grid = kernel_size_grid(args.preset, sizes)
    options = compare_options(args, grid, Path("runs") / f"kernel-size-{RunSpec(args.preset, args.preset).slug}")
    if not args.report_only:
        prepare_training_process()
    code = compare_and_report(options, args.report_only)
    if not main_process():  # the main process alone writes the comparison's report and its figure
        return code
    with run_folder_lock(options.output_dir):  # the figure joins the comparison's folder as its runs did
        figure = plot_sweep(options, args.preset, sizes)
    print(figure)
    return code
