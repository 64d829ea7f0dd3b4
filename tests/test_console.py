"""Readable output: the libraries' reports go to the run folder's log.txt, and with --verbose to the screen too."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.tiny import save_tiny_checkpoint

from convattn.cli import main
from convattn.data.squad import load_squad_file

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "squad"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    questions = load_squad_file(FIXTURES / "train-v1.1.json", "1.1")
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), list(questions["context"]) * 3)


def squad(checkpoint: Path, out: Path, *extra: str) -> int:
    return main(["squad", "--model", str(checkpoint), "--version", "1.1", "--train-file",
                 str(FIXTURES / "train-v1.1.json"), "--dev-file", str(FIXTURES / "dev-v1.1.json"), "--output-dir",
                 str(out), "--seeds", "1", "--max-steps", "3", "--batch-size", "4", "--max-length", "64",
                 "--max-query-length", "16", *extra])


def test_library_reports_go_to_the_log_file(checkpoint, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert squad(checkpoint, tmp_path / "quiet") == 0
    screen = "".join(capfd.readouterr())
    for noise in ("LOAD REPORT", "{'loss'", "Map:", "Loading weights"):
        assert noise not in screen
    assert "convattn squad: v1.1 seed 0: EM" in screen  # the short line per evaluation stays
    log = (tmp_path / "quiet" / "log.txt").read_text()
    assert "LOAD REPORT" in log and "convattn.trainer" in log and '"loss"' in log


def test_verbose_shows_them_live(checkpoint, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert squad(checkpoint, tmp_path / "verbose", "--verbose") == 0
    screen = "".join(capfd.readouterr())
    assert "{'loss'" in screen and "Running training" in screen  # the Trainer's own lines, live
    log = (tmp_path / "verbose" / "log.txt").read_text()  # and in the run folder too
    assert "LOAD REPORT" in log and '"loss"' in log


@pytest.mark.parametrize(("environment", "main"), [
    ({}, True),
    ({"RANK": "0", "WORLD_SIZE": "2"}, True),
    ({"RANK": "1", "WORLD_SIZE": "2"}, False),
    ({"RANK": "1"}, True),  # a leftover of another launch: this process runs alone, so it writes and locks
    ({"RANK": "1", "WORLD_SIZE": "1"}, True),
])
def test_the_main_process_is_rank_0_or_a_process_that_runs_alone(monkeypatch, tmp_path, environment, main):
    from convattn.console import main_process
    from convattn.runs.folder import LOCK_FILE, run_folder_lock

    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert main_process() is main
    with run_folder_lock(tmp_path / "run"):
        assert (tmp_path / "run" / LOCK_FILE).is_file() is main


def test_a_librarys_python_warning_goes_to_the_log_file_and_with_verbose_to_the_screen(tmp_path, capsys):
    """A warnings.warn of a library (torch's pin_memory on CPU, issue 66) asks nothing of the user: log.txt only,
    unless --verbose."""
    import warnings

    from convattn import console

    for verbose, folder in ((False, tmp_path / "quiet"), (True, tmp_path / "verbose")):
        console.configure(verbose=verbose)
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found", UserWarning,
                          stacklevel=1)
        console.log_to(folder)
        assert ("pin_memory" in capsys.readouterr().err) == verbose
        assert "py.warnings WARNING" in (folder / "log.txt").read_text()
    console.configure(verbose=False)


def test_what_the_process_logs_after_a_command_stays_out_of_its_log_file(checkpoint, tmp_path, monkeypatch):
    """A command's log.txt is that command's: once main() returns, a library's record in the same process (a test,
    a notebook) is neither appended to it nor written to a log.txt under a relative folder of the new working
    folder."""
    import logging

    monkeypatch.chdir(tmp_path)
    assert main(["plot", "attention", str(checkpoint), "--text", "the lazy dog", "--output-dir=figs"]) == 0
    before = (tmp_path / "figs" / "log.txt").read_bytes() if (tmp_path / "figs" / "log.txt").exists() else None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    logging.getLogger("transformers.modeling_utils").warning("a record after the command ended")
    assert not (elsewhere / "figs").exists()
    after = (tmp_path / "figs" / "log.txt").read_bytes() if (tmp_path / "figs" / "log.txt").exists() else None
    assert after == before
