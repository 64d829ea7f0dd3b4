"""The run-folder helpers shared by pretrain, glue, compare: atomic writes, option diffs, --overwrite."""

from pathlib import Path

import pytest

from convattn.cli import main
from convattn.errors import UsageError
from convattn.files import write_json_atomic, write_text_atomic
from convattn.runs.folder import LOCK_FILE, changed_options, check_removable, is_code_or_temp, run_folder_lock


def test_atomic_write_leaves_no_temporary_file(tmp_path):
    write_text_atomic(tmp_path / "a" / "b.txt", "x")
    write_json_atomic(tmp_path / "a" / "c.json", {"k": 1})
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b.txt", "c.json"]
    assert (tmp_path / "a" / "c.json").read_text() == '{\n  "k": 1\n}\n'


def test_an_atomic_write_that_fails_leaves_neither_its_file_nor_a_temporary_one(tmp_path):
    from convattn.files import atomic_path

    (tmp_path / "kept.json").write_text("the earlier content")
    for name in ("kept.json", "new.json"):
        with pytest.raises(RuntimeError), atomic_path(tmp_path / name) as tmp:
            tmp.write_text("half")
            raise RuntimeError("the disk filled up")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]
    assert (tmp_path / "kept.json").read_text() == "the earlier content"


def test_changed_options_leave_out_the_allowed_ones():
    saved, current = {"lr": 1, "output_dir": "a", "seed": 3}, {"lr": 2, "output_dir": "b", "seed": 3, "new": 0}
    assert changed_options(saved, current) == "lr: 1 -> 2, new: None -> 0"


def test_only_a_convattn_run_may_be_replaced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "pretrain_options.json").write_text("{}")
    check_removable(run, "pretrain_options.json")  # a convattn run
    check_removable(tmp_path / "empty-or-missing", "pretrain_options.json")
    mine = tmp_path / "mydocs"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    for path in (mine, Path("."), tmp_path.parent, Path.home(), Path("/")):
        with pytest.raises(UsageError, match="`overwrite`"):
            check_removable(path, "pretrain_options.json")


def test_the_working_directory_its_parents_and_home_are_never_removed_even_holding_a_run_record(tmp_path,
                                                                                               monkeypatch):
    run = tmp_path / "run"
    (run / "inside").mkdir(parents=True)
    (run / "pretrain_options.json").write_text("{}")
    monkeypatch.chdir(run / "inside")
    with pytest.raises(UsageError, match="will not remove"):
        check_removable(run, "pretrain_options.json")  # a parent of the working directory
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(run))
    with pytest.raises(UsageError, match="will not remove"):
        check_removable(run, "pretrain_options.json")  # the home directory


def test_the_lock_removes_only_the_empty_folders_it_made(tmp_path):
    mine = tmp_path / "mine"  # the user's, empty
    mine.mkdir()
    with run_folder_lock(mine / "run" / "seed0", enabled=True):
        assert (mine / "run" / "seed0" / LOCK_FILE).is_file()
    assert mine.is_dir() and list(mine.iterdir()) == []  # the two it made went, nothing was written into them
    with run_folder_lock(mine, enabled=True):
        pass
    assert mine.is_dir() and list(mine.iterdir()) == []  # there before the run: stays


@pytest.mark.parametrize(("name", "ours"), [
    ("convattn_model.py", True), (".metrics.jsonl.k3j4ab.tmp", True), (".perplexity.png.k3j4ab.png", True),
    ("analysis.py", False), ("model.py", False), (".notes.tmp", False), (".draft.png", False), ("notes.tmp", False),
])
def test_only_the_saved_modeling_code_and_atomic_writes_temporary_files_are_convattns(name, ours):
    assert is_code_or_temp(name) == ours


@pytest.mark.parametrize("output_dir", ["mydocs", "."])
def test_pretrain_overwrite_keeps_a_users_files(tmp_path, monkeypatch, capsys, output_dir):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mydocs").mkdir()
    (tmp_path / "mydocs" / "notes.txt").write_text("mine")
    assert main(["pretrain", "--output-dir", output_dir, "--overwrite", "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("convattn pretrain: error: --overwrite") and len(err.strip().splitlines()) == 1
    assert (tmp_path / "mydocs" / "notes.txt").read_text() == "mine"
