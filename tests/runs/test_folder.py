"""The run-folder helpers shared by pretrain, glue, compare: atomic writes, option diffs, --overwrite."""

from pathlib import Path

import pytest

from convattn.cli import main
from convattn.errors import UsageError
from convattn.files import write_json_atomic, write_text_atomic
from convattn.runs.folder import changed_options, check_removable


def test_atomic_write_leaves_no_temporary_file(tmp_path):
    write_text_atomic(tmp_path / "a" / "b.txt", "x")
    write_json_atomic(tmp_path / "a" / "c.json", {"k": 1})
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b.txt", "c.json"]
    assert (tmp_path / "a" / "c.json").read_text() == '{\n  "k": 1\n}\n'


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


@pytest.mark.parametrize("output_dir", ["mydocs", "."])
def test_pretrain_overwrite_keeps_a_users_files(tmp_path, monkeypatch, capsys, output_dir):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mydocs").mkdir()
    (tmp_path / "mydocs" / "notes.txt").write_text("mine")
    assert main(["pretrain", "--output-dir", output_dir, "--overwrite", "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("convattn pretrain: error: --overwrite") and len(err.strip().splitlines()) == 1
    assert (tmp_path / "mydocs" / "notes.txt").read_text() == "mine"
