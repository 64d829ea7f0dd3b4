"""Errors that the command line reports as one line and exit code 2."""


class UsageError(Exception):
    """Bad input from the user (a flag, a file, a corpus): the message says what to change."""
