"""`convattn` command line: one subcommand per module in `convattn.commands`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import traceback

from convattn.commands.arguments import HelpFormatter
from convattn.errors import UsageError

# each module defines NAME, HELP, DESCRIPTION, optionally EXAMPLES, and `add_arguments(parser)`, which sets `func`
COMMAND_MODULES = (
    "convattn.commands.presets",
    "convattn.commands.pretrain",
    "convattn.commands.compare",
    "convattn.commands.glue",
    "convattn.commands.squad",
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
    parser.set_defaults(loads_models=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        command = subparsers.add_parser(module.NAME, help=module.HELP, description=module.DESCRIPTION,
                                        epilog=getattr(module, "EXAMPLES", None), formatter_class=HelpFormatter)
        module.add_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.loads_models:
            import convattn
            from convattn.training import console

            convattn.register_auto_classes()  # the command line starts without it (see convattn/__init__.py)
            console.configure(verbose=getattr(args, "verbose", False))
        return args.func(args) or 0
    except (UsageError, ValueError, FileNotFoundError) as err:
        print(f"convattn {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`convattn presets | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(f"convattn {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # not bad input: one line here, the whole traceback in a file
        message = (str(err).strip().splitlines() or [""])[0][:200]
        print(f"convattn {args.command}: unexpected error: {type(err).__name__}: {message} (full traceback: "
              f"{write_traceback(args.command)})", file=sys.stderr)
        return 1


def write_traceback(command: str) -> str:
    """The current exception's traceback in a new file under the temporary directory; returns its path."""
    with tempfile.NamedTemporaryFile("w", prefix=f"convattn-{command}-", suffix=".traceback.txt",
                                     delete=False) as f:
        traceback.print_exc(file=f)
    return f.name


if __name__ == "__main__":
    sys.exit(main())
