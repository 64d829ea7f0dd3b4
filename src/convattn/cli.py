"""`convattn` command line: one subcommand per module in `convattn.commands`."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import sys
import tempfile
import traceback

from convattn.commands.arguments import HelpFormatter
from convattn.errors import UsageError
from convattn.openmp import choose_waiting

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


# argparse's words for a value its type rejected, and what the value must be instead
TYPE_WORDS = {"int": "a whole number, e.g. 8000", "float": "a number, e.g. 3e-4"}
INVALID_VALUE = re.compile(r"argument (?P<flag>[^:]+): invalid (?P<type>\w+) value: (?P<value>.*)")
# a flag without its value (given none, or one starting with "-", which argparse takes for a flag)
EXPECTED_VALUE = re.compile(r"argument (?P<flag>-[^:]+): expected one argument")
# an argument argparse took for a flag it does not know
UNKNOWN_DASHED = re.compile(r"unrecognized arguments: (?P<first>-(?!-)\S*)(?: .*)?")
# a negative number, also in scientific notation (argparse alone takes `--lr -1e-3` for a flag named -1e-3)
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class Parser(argparse.ArgumentParser):
    """argparse with its errors in one line (no usage dump), naming the flag and what it takes; subcommands'
    parsers are of this class too."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER

    def parse_known_args(self, args=None, namespace=None):
        self.given = list(sys.argv[1:] if args is None else args)  # what error() may name
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        message = one_line_error(message)
        if message.startswith("the following arguments are required") and (taken := self.taken_for_flag()):
            message += f" ({taken} was taken for a flag: a path that starts with \"-\" is given as ./{taken})"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def taken_for_flag(self) -> str | None:
        """The first argument given that starts with "-" and is none of this parser's flags (nor a number)."""
        flags = {flag for action in self._actions for flag in action.option_strings}
        return next((arg for arg in getattr(self, "given", ()) if arg.startswith("-") and arg != "--"
                     and arg.split("=")[0] not in flags and not NEGATIVE_NUMBER.match(arg)), None)


def one_line_error(message: str) -> str:
    """argparse's error message, a rejected value said as what the flag takes; a flag missing its value, or an
    argument argparse took for a flag, with how to give a value that starts with "-" (a folder named -runs)."""
    rejected = INVALID_VALUE.fullmatch(message)
    if rejected and rejected["type"] in TYPE_WORDS:
        return f"{rejected['flag']} {rejected['value']} is not {TYPE_WORDS[rejected['type']]}"
    if expecting := EXPECTED_VALUE.fullmatch(message):
        flag = expecting["flag"].split("/")[-1]
        return (f"{flag} expects a value; one that starts with \"-\" is given as {flag}=-name, or as a path "
                "./-name")
    if unknown := UNKNOWN_DASHED.fullmatch(message):
        return (f"{message}: a path that starts with \"-\" is given as ./{unknown['first']} (an option's value as "
                f"--option={unknown['first']})")
    return message.removeprefix("argument ")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
        set_option_flags(command)
    return parser


def set_option_flags(parser: argparse.ArgumentParser) -> None:
    """dest -> flag of `parser` and of its own subcommands (`plot kernel-size`), for naming options in errors
    (argparse lists a parser's actions only in `_actions`)."""
    parser.set_defaults(option_flags={a.dest: a.option_strings[-1] for a in parser._actions if a.option_strings})
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                set_option_flags(child)


def flag_namer(args: argparse.Namespace):
    """field -> the command's flag that sets it (`learning_rate` -> `--lr`), or the field where no flag does."""
    from convattn.commands.arguments import ARCHITECTURE_FLAGS

    flags = args.option_flags
    by_field = {field: flags[dest] for dest, field in ARCHITECTURE_FLAGS.items() if dest in flags}
    by_field |= getattr(args, "field_flags", {})  # a command's own flag for a field (plot kernel-size: the sizes)
    return lambda field: flags.get(field) or by_field.get(field) or field


FIELD_VALUE = re.compile(r"(?P<field>\w+)=(?P<rest>.*)", re.DOTALL)


def with_flag(message: str, name) -> str:
    """A config error 'num_hidden_layers=-2 must be ...' as '--layers -2 must be ...' where a flag sets the field
    (`name`: field -> flag, or the field itself)."""
    found = FIELD_VALUE.fullmatch(message)
    if found is None or name(found["field"]) == found["field"]:
        return message
    return f"{name(found['field'])} {found['rest']}"


def main(argv: list[str] | None = None) -> int:
    choose_waiting(sys.argv[1:] if argv is None else argv)  # first: parsing --time-budget already imports torch
    parser = build_parser()
    args = parser.parse_args(argv)
    denormals_before = None
    try:
        if args.loads_models:
            import convattn
            from convattn import console
            from convattn.denormals import flush_denormals

            # before the first parallel region starts OpenMP's threads, which take the flag from this one
            denormals_before = flush_denormals()
            convattn.register_auto_classes()  # the command line starts without it (see convattn/__init__.py)
            console.configure(verbose=getattr(args, "verbose", False))
        return args.func(args) or 0
    except UsageError as err:
        say_error(args.command, err.describe(flag_namer(args)))
        return 2
    except (ValueError, FileNotFoundError) as err:
        say_error(args.command, with_flag(str(err), flag_namer(args)))
        return 2
    except BrokenPipeError:  # the reader went away (`convattn presets | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(f"convattn {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        cause = known_cause(err)
        if cause is None:
            return unexpected(args.command)
        say_error(args.command, cause)
        return 2
    finally:
        if args.loads_models:
            from convattn import console

            console.release()
        if denormals_before is not None:
            from convattn.denormals import set_denormals

            set_denormals(denormals_before)


def say_error(command: str, message: str) -> None:
    """The error line: one line, whatever the message holds (a library's message can span several: a table, a
    wrapped traceback, a path with a newline)."""
    print(f"convattn {command}: error: {' '.join(message.split())}", file=sys.stderr)


# failures of the machine, not of convattn: said in one line (exit 2) with what to do
OS_ERRORS = {
    errno.ENOSPC: "the disk is full; free some space (or point --output-dir / --cache-dir elsewhere)",
    errno.EDQUOT: "the disk quota is used up; free some space (or point --output-dir / --cache-dir elsewhere)",
    errno.EROFS: "the filesystem is read-only; choose a writable --output-dir / --cache-dir",
    errno.EACCES: "permission denied; check the file's permissions or choose another path",
    errno.EPERM: "operation not permitted; check the file's permissions or choose another path",
    errno.ENAMETOOLONG: "a file name is too long for the filesystem; choose a shorter path",
    errno.ENOTDIR: "a part of the path is a file, not a directory; choose another path",
    errno.EISDIR: "the path is a directory where a file is needed; choose another path",
    errno.ELOOP: "the path has a symbolic-link loop; choose another path",
}
# torch / safetensors wordings (torch's zip writer says "unexpected pos" when a write came up short)
DISK_FULL_TEXTS = ("No space left on device", "StorageFull", "file write failed", "unexpected pos")


def known_cause(err: BaseException) -> str | None:
    """One line for an error whose cause is known (a full disk, no permission, ...), looking through the chain of
    causes; None for the unknown."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in OS_ERRORS:
            where = f" ({err.filename})" if err.filename else ""
            return f"{err.strerror or os.strerror(err.errno)}{where}: {OS_ERRORS[err.errno]}"
        if any(text in str(err) for text in DISK_FULL_TEXTS):
            return f"writing a file failed ({str(err).strip().splitlines()[0][:120]}): {OS_ERRORS[errno.ENOSPC]}"
        err = err.__cause__ or err.__context__
    return None


def unexpected(command: str) -> int:
    """Not bad input: one line here, the whole traceback in a file."""
    err = sys.exc_info()[1]
    message = (str(err).strip().splitlines() or [""])[0][:200]
    print(f"convattn {command}: unexpected error: {type(err).__name__}: {message} (full traceback: "
          f"{write_traceback(command)})", file=sys.stderr)
    return 1


def write_traceback(command: str) -> str:
    """The current exception's traceback in a new file under the temporary directory; returns its path."""
    with tempfile.NamedTemporaryFile("w", prefix=f"convattn-{command}-", suffix=".traceback.txt",
                                     delete=False) as f:
        traceback.print_exc(file=f)
    return f.name


if __name__ == "__main__":
    sys.exit(main())
