"""Long SQuAD phases say how far they are: windows made while encoding, windows answered while predicting."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.tiny import save_tiny_checkpoint

from convattn.cli import main
from convattn.training.squad.features import Progress

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "squad"


pytestmark = pytest.mark.usefixtures("one_thread")


def test_progress_lines_name_questions_and_windows(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(Progress, "period", 0.0)  # a line at every step, as a long run gets every 10 s
    checkpoint = save_tiny_checkpoint(tmp_path / "model", ["where does the river elm rise ?"] * 40)
    assert main(["squad", "--model", str(checkpoint), "--version", "1.1", "--train-file",
                 str(FIXTURES / "train-v1.1.json"), "--dev-file", str(FIXTURES / "dev-v1.1.json"), "--output-dir",
                 str(tmp_path / "out"), "--seeds", "1", "--max-steps", "2", "--batch-size", "4", "--max-length", "48",
                 "--doc-stride", "16", "--max-query-length", "12"]) == 0
    err = capsys.readouterr().err
    assert "windows of the training questions: 7 of 7 questions, " in err and " windows so far" in err
    assert "answering the dev questions: " in err and " windows (" in err
    assert "7 training questions in " in err


def test_a_short_phase_prints_nothing(capsys):
    progress = Progress("something quick", 10, "items")
    progress.advance(10)
    assert capsys.readouterr().err == ""
