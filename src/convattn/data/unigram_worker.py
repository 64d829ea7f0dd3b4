"""Fit a unigram tokenizer in a process of its own: `python -P unigram_worker.py DIR` (see `tokenizer.py`).

DIR holds `untrained.json` (the tokenizer to train), `trainer.json` (the `UnigramTrainer` arguments) and
`text.jsonl` (one JSON string per row of text); the trained tokenizer is written to `DIR/trained.json`.
Run as a file, it imports `tokenizers` only, so it starts at once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, trainers

BATCH_ROWS = 1000


def _exit_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (a killed run leaves no orphan training on)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent still ends it on Ctrl-C and SIGTERM
        pass


def _rows(path: Path) -> Iterator[list[str]]:
    batch: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            batch.append(json.loads(line))
            if len(batch) == BATCH_ROWS:
                yield batch
                batch = []
    if batch:
        yield batch


def fit(directory: Path) -> None:
    tokenizer = Tokenizer.from_file(str(directory / "untrained.json"))
    trainer = trainers.UnigramTrainer(**json.loads((directory / "trainer.json").read_text(encoding="utf-8")))
    tokenizer.train_from_iterator(_rows(directory / "text.jsonl"), trainer=trainer)
    tokenizer.save(str(directory / "trained.json"))


if __name__ == "__main__":
    _exit_with_parent()
    try:
        fit(Path(sys.argv[1]))
    except Exception as err:  # the parent reads the last line of stderr
        print(f"{type(err).__name__}: {err}".replace("\n", " "), file=sys.stderr)
        sys.exit(1)
