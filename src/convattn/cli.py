"""`convattn` command line: one subcommand per module in `convattn.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys

from convattn.errors import UsageError

# each module defines `register(subparsers)`, which adds its parser and sets `func`
COMMAND_MODULES = (
    "convattn.commands.presets",
    "convattn.commands.pretrain",
    "convattn.commands.compare",
    "convattn.commands.glue",
    "convattn.commands.plot",
    "convattn.commands.export",
    "convattn.commands.push",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convattn",
        description="Pretrain, fine-tune, compare and analyse BERT-style encoders with convolution-augmented "
                    "attention (composite attention, ConvBERT, Linformer / Conv-Linformer).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except (UsageError, ValueError, FileNotFoundError) as err:
        print(f"convattn {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"convattn {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
