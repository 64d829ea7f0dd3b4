"""Errors that the command line reports as one line and exit code 2.

A message names the options it is about with `option(field)`: read as a library error it says the field in
backticks (`seq_len`), on the command line the flag that sets it (--seq-len): see `UsageError.describe`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_MARK = "\x1f"  # the ASCII unit separator: never part of a value shown in a message
_OPTION = re.compile(f"{_MARK}(\\w+){_MARK}")


def option(field: str) -> str:
    """The name of an option field inside a UsageError message."""
    return f"{_MARK}{field}{_MARK}"


def listed(names: list[str]) -> str:
    """The first three names, and how many more."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


class UsageError(Exception):
    """Bad input from the user (a flag, a file, a corpus): the message says what to change."""

    def describe(self, name: Callable[[str], str] = "`{}`".format) -> str:
        """The message with each option named by `name(field)` (the field in backticks by default)."""
        return _OPTION.sub(lambda m: name(m.group(1)), super().__str__())

    def __str__(self) -> str:
        return self.describe()
