"""Subcommands of the `convattn` command line (see `convattn.cli`)."""
