"""The process set-up of every command that trains (pretrain, compare, plot kernel-size, glue, squad), made the same
way by each just before it trains. Seeds are not the process's: each run seeds its own Trainer."""

from __future__ import annotations

import signal
import threading


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt


def prepare_training_process() -> None:
    """Refuse a launcher's variables left over from another launch (`check_launch_environment`), and make a kill
    (SIGTERM) stop like Ctrl-C: checkpoints stay intact, and an --overwrite gives the old results back at once."""
    from convattn.console import check_launch_environment

    check_launch_environment()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop_on_sigterm)
