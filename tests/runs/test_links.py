"""Links never make convattn write, truncate or remove what it did not write. Each case puts a symbolic link, a hard
link or a special file where a run's file or folder goes, runs the command (or the call a command makes before it
writes), and checks the one line it is refused with, and every file under the test's folder, inside the run folder
and outside it, hashed before and after. The folder given as --output-dir is followed; nothing inside it is written
or removed through a link: a symbolic link where a run's file or folder goes is refused by name; a hard-linked file
that convattn writes in place (the lock, log.txt) is replaced by a file of its own; a special file is refused."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
from helpers.tiny import save_tiny_checkpoint, save_tiny_mlm
from helpers.trees import finished_run, tree

from convattn.cli import main
from convattn.console import RunLog
from convattn.errors import UsageError
from convattn.export import check_onnx_path
from convattn.files import append_text, write_text_atomic
from convattn.runs.finetune import foreign_files, layout
from convattn.runs.folder import LOCK_FILE, check_own_folder, run_folder_lock
from convattn.runs.pretrain import PRETRAIN
from convattn.runs.pretrain import foreign_files as pretrain_foreign_files
from convattn.runs.replace import recover_replaced_run

GLUE_DATA = Path(__file__).resolve().parents[1] / "fixtures" / "glue_data"
LAYOUTS = {"glue": layout("glue"), "squad": layout("squad"), "pretrain": PRETRAIN}
MINE = "years of work\n"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
needs_onnx = pytest.mark.skipif(importlib.util.find_spec("onnxscript") is None or
                                importlib.util.find_spec("onnx") is None, reason="needs the [onnx] extra")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CONVATTN_CACHE", str(tmp_path_factory.getbasetemp() / "convattn-cache"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), ["a dog runs in the park .", "the cat sat ."] * 30)


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A folder of the user's, outside the run folder."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "notes.txt").write_text(MINE)
    return folder


def link_in_place(run: Path, place: str, elsewhere: Path) -> None:
    """What the run wrote at `place` moved to the user's folder beside a file of theirs (a folder) or as their file
    (a file), and a link to it in its place."""
    path, target = run / place, elsewhere / "moved" / Path(place).name
    target.parent.mkdir(exist_ok=True)
    if path.exists():
        shutil.move(path, target)
    else:
        target.mkdir()
    if target.is_dir():
        (target / "mine.txt").write_text(MINE)
    else:
        target.write_text(MINE)
    path.symlink_to(target)


def one_error_line(capsys, command: str, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"convattn {command}: error: ") and "\n" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


LINKS = [  # (job, the place of one of its files or folders, a link there)
    ("glue", "runs"), ("glue", "runs/sst2"), ("glue", "runs/sst2/seed0"), ("glue", "runs/sst2/seed0/predictions"),
    ("glue", "runs/sst2/seed0/predictions/SST-2.tsv"), ("glue", "submission"), ("glue", "models"),
    ("glue", "models/sst2"), ("glue", "log.txt"), ("glue", "glue_results.json"), ("glue", ".replaced-run"),
    ("squad", "runs"), ("squad", "runs/squad1.1/seed0/predictions.json"), ("squad", "models/squad1.1"),
    ("pretrain", "checkpoints"), ("pretrain", "checkpoints/checkpoint-2"), ("pretrain", "tensorboard"),
    ("pretrain", "log.txt"), ("pretrain", "metrics.jsonl"), ("pretrain", ".replaced-run"),
]


@pytest.mark.parametrize(("job", "place"), LINKS, ids=[f"{job}:{place}" for job, place in LINKS])
def test_a_link_where_a_job_writes_is_refused_before_anything_is_touched(tmp_path, elsewhere, job, place):
    """What every job does first in its folder (under the lock): finish a killed run, which moves and removes."""
    run = finished_run(tmp_path / "run", job)
    link_in_place(run, place, elsewhere)
    before = tree(tmp_path)
    with pytest.raises(UsageError) as refused, run_folder_lock(run):
        recover_replaced_run(run, LAYOUTS[job])
    message = str(refused.value)
    assert f": {place} is a symbolic link where convattn writes its own files" in message and "\n" not in message
    assert tree(tmp_path) == before


@pytest.mark.parametrize(("job", "place"), [("pretrain", "checkpoints"), ("pretrain", "tensorboard"),
                                           ("glue", "runs/sst2"), ("squad", "models")])
def test_a_link_is_named_as_a_link_and_never_entered(tmp_path, elsewhere, job, place):
    run = finished_run(tmp_path / "run", job)
    link_in_place(run, place, elsewhere)  # beside the run's own files there, a file of the user's
    foreign = pretrain_foreign_files(run) if job == "pretrain" else foreign_files(run, job)
    assert foreign == [f"{place} (a link)"]


@pytest.mark.parametrize("extra", [[], ["--overwrite"]], ids=["rerun", "overwrite"])
def test_glue_refuses_a_linked_runs_folder(checkpoint, tmp_path, elsewhere, capsys, extra):
    run = finished_run(tmp_path / "run", "glue")
    link_in_place(run, "runs", elsewhere)
    before = tree(tmp_path)
    assert main(["glue", "--model", str(checkpoint), "--task", "sst2", "--data-dir", str(GLUE_DATA), "--output-dir",
                 str(run), "--seeds", "1", *extra]) == 2
    one_error_line(capsys, "glue", f"--output-dir {run}: runs is a symbolic link", "remove it")
    assert tree(tmp_path) == before


def test_pretrain_overwrite_refuses_a_linked_checkpoints_folder(tmp_path, elsewhere, capsys):
    run = finished_run(tmp_path / "run", "pretrain")
    link_in_place(run, "checkpoints", elsewhere)
    before = tree(tmp_path)
    assert main(["pretrain", "--output-dir", str(run), "--overwrite", "--max-steps", "1"]) == 2
    one_error_line(capsys, "pretrain", "checkpoints is a symbolic link")
    assert tree(tmp_path) == before


def test_plot_refuses_a_link_among_its_figures(checkpoint, tmp_path, elsewhere, capsys):
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "attention_maps.png").symlink_to(elsewhere / "notes.txt")
    before = tree(tmp_path)
    assert main(["plot", "attention", str(checkpoint), "--output-dir", str(figures)]) == 2
    one_error_line(capsys, "plot", "attention_maps.png (a link)")
    assert tree(tmp_path) == before


LOCKS = [  # what is at <folder>/.convattn.lock -> the refusal
    pytest.param(lambda lock, elsewhere: lock.symlink_to(elsewhere / "notes.txt"), "is a symbolic link", id="a link"),
    pytest.param(lambda lock, elsewhere: lock.symlink_to(elsewhere / "new.txt"), "is a symbolic link",
                 id="a link to nothing"),
    pytest.param(lambda lock, elsewhere: os.mkfifo(lock), "is a named pipe", id="a named pipe"),
    pytest.param(lambda lock, elsewhere: lock.mkdir(), "is a folder", id="a folder"),
]


@pytest.mark.parametrize(("put", "refusal"), LOCKS)
def test_the_lock_is_never_written_through_a_link_or_into_a_special_file(tmp_path, elsewhere, put, refusal):
    run = tmp_path / "run"
    run.mkdir()
    put(run / LOCK_FILE, elsewhere)
    before = tree(tmp_path)
    with pytest.raises(UsageError, match=refusal) as refused, run_folder_lock(run):
        pass
    assert LOCK_FILE in str(refused.value) and "\n" not in str(refused.value)
    assert tree(tmp_path) == before


def test_a_hard_linked_lock_file_is_replaced_not_truncated(tmp_path, elsewhere):
    run = tmp_path / "run"
    run.mkdir()
    os.link(elsewhere / "notes.txt", run / LOCK_FILE)
    with run_folder_lock(run):
        assert (run / LOCK_FILE).stat().st_nlink == 1 and (run / LOCK_FILE).read_text().startswith("pid ")
    assert (elsewhere / "notes.txt").read_text() == MINE and not (run / LOCK_FILE).exists()


COMMANDS = {  # the commands the issue names -> their argv writing into FOLDER (a folder holding only a lock file)
    "pretrain": lambda model, folder: ["pretrain", "--output-dir", str(folder), "--max-steps", "1"],
    "glue": lambda model, folder: ["glue", "--model", str(model), "--task", "sst2", "--data-dir", str(GLUE_DATA),
                                   "--output-dir", str(folder), "--seeds", "1"],
    "plot": lambda model, folder: ["plot", "kernels", str(model), "--output-dir", str(folder)],
    "export": lambda model, folder: ["export", str(model), "--onnx", str(folder / "model.onnx")],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_no_command_truncates_the_file_a_linked_lock_points_to(checkpoint, tmp_path, elsewhere, capsys, command):
    if command == "export" and importlib.util.find_spec("onnxscript") is None:
        pytest.skip("needs the [onnx] extra")
    model = save_tiny_mlm(tmp_path / "model") if command == "export" else checkpoint
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / LOCK_FILE).symlink_to(elsewhere / "notes.txt")
    before = tree(tmp_path)
    assert main(COMMANDS[command](model, folder)) == 2
    one_error_line(capsys, command, LOCK_FILE)
    assert tree(tmp_path) == before


def test_the_log_is_never_appended_through_a_link_or_to_a_special_file(tmp_path, elsewhere):
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.txt").symlink_to(elsewhere / "notes.txt")
    os.mkfifo(run / "pipe.txt")
    before = tree(tmp_path)
    for name, refusal in (("log.txt", "is a symbolic link"), ("pipe.txt", "is a named pipe")):
        with pytest.raises(UsageError, match=refusal):
            RunLog().attach(run / name)
        with pytest.raises(UsageError, match=refusal):  # the helper itself, for any caller
            append_text(run / name, "a line\n")
    with pytest.raises(UsageError, match=re.escape("log.txt is a symbolic link")):  # compare's check of its folder
        check_own_folder(run, ("compare.json",))
    assert tree(tmp_path) == before


def test_a_hard_linked_log_gets_a_file_of_its_own(tmp_path, elsewhere):
    run = tmp_path / "run"
    run.mkdir()
    os.link(elsewhere / "notes.txt", run / "log.txt")
    log = RunLog()
    log.pending = ["a library's line"]
    log.attach(run / "log.txt")
    assert (run / "log.txt").read_text() == MINE + "a library's line\n"
    assert (elsewhere / "notes.txt").read_text() == MINE and (elsewhere / "notes.txt").stat().st_nlink == 1


def test_an_atomic_write_replaces_a_link_and_never_a_special_file(tmp_path, elsewhere):
    run = tmp_path / "run"
    run.mkdir()
    (run / "linked.json").symlink_to(elsewhere / "notes.txt")
    os.link(elsewhere / "notes.txt", run / "hard.json")
    os.mkfifo(run / "pipe.json")
    os.mkfifo(elsewhere / "fifo")
    (run / "to-fifo.json").symlink_to(elsewhere / "fifo")  # the link is replaced; what it names is not looked at
    write_text_atomic(run / "linked.json", "{}")
    write_text_atomic(run / "to-fifo.json", "{}")
    write_text_atomic(run / "hard.json", "{}")
    with pytest.raises(UsageError, match=re.escape("pipe.json is a named pipe, not a file")):
        write_text_atomic(run / "pipe.json", "{}")
    assert not (run / "linked.json").is_symlink() and (run / "linked.json").read_text() == "{}"
    assert (run / "hard.json").read_text() == "{}" and (elsewhere / "notes.txt").read_text() == MINE
    assert (run / "to-fifo.json").read_text() == "{}" and stat.S_ISFIFO((elsewhere / "fifo").lstat().st_mode)
    assert stat.S_ISFIFO((run / "pipe.json").lstat().st_mode) and sorted(p.name for p in run.iterdir()) == \
        ["hard.json", "linked.json", "pipe.json", "to-fifo.json"]


@root_only
def test_a_device_node_is_never_replaced(tmp_path):
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    before = tree(tmp_path)
    with pytest.raises(UsageError, match=re.escape("is a character device, not a file")):
        write_text_atomic(null, "{}")
    with pytest.raises(UsageError, match=r"`onnx` .* is a character device"):
        check_onnx_path(null)
    assert tree(tmp_path) == before


@root_only
@needs_onnx
def test_export_onto_a_device_node_is_refused(tmp_path, capsys):
    """`convattn export --onnx /dev/null` (as root) replaced the node with a file."""
    model = save_tiny_mlm(tmp_path / "model")
    null = tmp_path / "dev" / "null"
    null.parent.mkdir()
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    before = tree(tmp_path)
    assert main(["export", str(model), "--onnx", str(null)]) == 2
    one_error_line(capsys, "export", f"--onnx {null} is a character device")
    assert tree(tmp_path) == before
