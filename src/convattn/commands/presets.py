"""`convattn presets`: list the named presets with their parameter counts."""

from __future__ import annotations

import argparse
import fnmatch

from convattn.commands.arguments import HelpFormatter


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "presets",
        help="list named presets (paper rows) with parameter counts",
        description="List the named presets, one per paper row, with the fields that define them and their "
                    "parameter counts (masked-LM model, tied decoder counted once; encoder-only in brackets).",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("pattern", nargs="?", default="*", help="glob over preset names, e.g. 'chang2021-small/*'")
    parser.add_argument("--no-count", action="store_true", help="skip building models to count parameters")
    parser.set_defaults(func=run)


def describe(fields: dict) -> str:
    shown = {k: v for k, v in fields.items()
             if k in ("position_embedding_type", "relative_terms", "value_depthwise_conv", "conv_projections",
                      "head_ratio", "num_groups", "sequence_projection", "linformer_k", "max_position_embeddings")}
    return ", ".join(f"{k}={v}" for k, v in shown.items())


def run(args: argparse.Namespace) -> int:
    import torch

    from convattn import ConvAttnConfig, ConvAttnForMaskedLM
    from convattn.presets import preset_fields, preset_names

    names = [n for n in preset_names() if fnmatch.fnmatch(n, args.pattern)]
    if not names:
        raise ValueError(f"no preset matches {args.pattern!r}; run `convattn presets` to see them all")
    width = max(map(len, names))
    for name in names:
        line = f"{name:<{width}}"
        if not args.no_count:
            with torch.device("meta"):
                model = ConvAttnForMaskedLM(ConvAttnConfig.from_preset(name))
            line += f"  {model.num_parameters():>12,}  [{model.convattn.num_parameters():>12,}]"
        print(f"{line}  {describe(preset_fields(name))}")
    return 0
