"""A tiny pretraining run for tests: a random-word corpus and the flags of a 2-layer, hidden-32 model."""

from __future__ import annotations

import random
from pathlib import Path

from transformers import TrainerCallback

WORDS = "the of and to in a is was for on as with by he at from his an were are city film year war king".split()  # noqa: SIM905
TINY = ["--preset", "chang2021-small/composite", "--layers", "2", "--hidden", "32", "--heads", "4",
        "--intermediate", "64", "--embedding-size", "16", "--vocab-size", "150", "--seq-len", "32",
        "--batch-size", "8", "--max-steps", "8", "--eval-every", "4", "--save-every", "2", "--log-every", "2",
        "--warmup", "2", "--eval-samples", "24"]


def write_corpus(directory: Path, train_lines: int = 600, eval_lines: int = 60) -> Path:
    """train.txt and valid.txt of random sentences over WORDS (seeded: the same text every time)."""
    rng = random.Random(0)
    for name, n in (("train.txt", train_lines), ("valid.txt", eval_lines)):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) for _ in range(n)]
        (directory / name).write_text("\n".join(lines) + "\n")
    return directory


def tiny_args(corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["pretrain", *TINY, "--train-file", str(corpus / "train.txt"), "--eval-file", str(corpus / "valid.txt"),
            "--output-dir", str(out), *extra]


class InterruptAt(TrainerCallback):
    """Ctrl-C at the end of optimizer step `step`."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt


def main_offline(argv: list[str], tmp_path_factory) -> int:
    """`convattn ARGV` without the hub and with the session's cache: for module-scoped fixtures, which cannot use
    the function-scoped `offline` fixture of tests/training/conftest.py."""
    import pytest

    from convattn.cli import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("CONVATTN_CACHE", str(tmp_path_factory.getbasetemp() / "convattn-cache"))
        return main(argv)
