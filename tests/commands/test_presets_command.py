"""`convattn presets` lists presets with counts; an unmatched pattern is a usage error."""

from __future__ import annotations

from convattn.cli import main


def test_lists_paper_rows_with_counts(capsys):
    assert main(["presets", "chang2021-small/*"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header[:4] == ["preset", "MLM", "params", "[encoder]"] and "define" in header
    assert "chang2021-small/composite " in out and "13,428,196" in out
    assert "chang2021-small/absolute " in out and "13,430,708" in out


def test_unknown_pattern_exits_2_with_one_line(capsys):
    assert main(["presets", "nothing*"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no preset matches 'nothing*'" in err[0]
