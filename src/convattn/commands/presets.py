"""`convattn presets`: list the named presets with their parameter counts."""

from __future__ import annotations

import argparse
import fnmatch
import json

from convattn import configs

# {preset: [masked-LM parameters, encoder parameters]}, precomputed so that listing needs no torch; a test
# checks it against counts of freshly built models (`count_parameters`)
COUNTS_FILE = "preset_counts.json"


NAME = "presets"
HELP = "list named presets (paper rows) with parameter counts"
DESCRIPTION = (
    "List the named presets, one per paper row, with the fields that define them and their "
    "parameter counts: the masked-LM model (tied decoder counted once) and, in brackets, the encoder alone."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pattern", nargs="?", default="*", help="glob over preset names, e.g. 'chang2021-small/*'")
    parser.add_argument("--no-count", action="store_true", help="skip building models to count parameters")
    parser.set_defaults(func=run, loads_models=False)


def describe(fields: dict) -> str:
    shown = {k: v for k, v in fields.items()
             if k in ("position_embedding_type", "rope_theta", "relative_terms", "value_depthwise_conv",
                      "conv_projections", "head_ratio", "num_groups", "convbert_kernel_from", "sequence_projection",
                      "linformer_k", "max_position_embeddings")}
    return ", ".join(f"{k}={v}" for k, v in shown.items())


def count_parameters(name: str) -> list[int]:
    """[masked-LM parameters (tied decoder once), encoder parameters] of a preset, from a model on the meta device."""
    import torch

    from convattn import ConvAttnConfig, ConvAttnForMaskedLM

    with torch.device("meta"):
        model = ConvAttnForMaskedLM(ConvAttnConfig.from_preset(name))
    return [model.num_parameters(), model.convattn.num_parameters()]


def precomputed_counts() -> dict[str, list[int]]:
    return json.loads(configs.read_text(COUNTS_FILE))


def run(args: argparse.Namespace) -> int:
    from convattn.presets import preset_fields, preset_names

    names = [n for n in preset_names() if fnmatch.fnmatch(n, args.pattern)]
    if not names:
        raise ValueError(f"no preset matches {args.pattern!r}; run `convattn presets` to see them all")
    counts = {} if args.no_count else precomputed_counts()
    width = max(map(len, ["preset", *names]))
    header = f"{'preset':<{width}}"
    if not args.no_count:
        header += f"  {'MLM params':>12}  {'[encoder]':>14}"
    print(f"{header}  fields that define it")
    for name in names:
        line = f"{name:<{width}}"
        if not args.no_count:
            total, encoder = counts[name] if name in counts else count_parameters(name)
            line += f"  {total:>12,}  [{encoder:>12,}]"
        print(f"{line}  {describe(preset_fields(name))}")
    return 0
