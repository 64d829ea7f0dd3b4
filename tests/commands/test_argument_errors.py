"""A value argparse rejects is one line on stderr, exit 2, naming the flag and what it takes (no usage dump), and a
negative number is a value, not a flag; nothing is written."""

from __future__ import annotations

import pytest

from convattn.cli import main

REJECTED = [  # (argv after the command, what the line says)
    (["pretrain", "--vocab-size", "8k"], "convattn pretrain: error: --vocab-size '8k' is not a whole number"),
    (["pretrain", "--lr", "abc"], "convattn pretrain: error: --lr 'abc' is not a number, e.g. 3e-4"),
    (["pretrain", "--time-budget", "3x"], "convattn pretrain: error: --time-budget: '3x': give a duration such as"),
    (["pretrain", "--time-budget", "1e300"], "convattn pretrain: error: --time-budget: "),
    (["pretrain", "--format", "lines"], "--format: invalid choice: 'lines' (choose from 'pairs', 'packed')"),
    (["glue", "--task", "sst2"], "convattn glue: error: the following arguments are required: --model"),
    (["compare", "--seeds", "two"], "convattn compare: error: --seeds 'two' is not a whole number"),
    (["plot", "kernel-size", "--max-steps", "1.5"], "convattn plot kernel-size: error: --max-steps '1.5' is not"),
    (["squad", "--model", "m", "--doc-stride", "x"], "convattn squad: error: --doc-stride 'x' is not a whole number"),
    (["frobnicate"], "convattn: error: COMMAND: invalid choice: 'frobnicate'"),
    # a value that starts with "-" (a folder named -runs) is taken for a flag: the line says how to give it
    (["pretrain", "--output-dir", "-runs"], "convattn pretrain: error: --output-dir expects a value; one that "
                                             "starts with \"-\" is given as --output-dir=-name, or as a path ./-name"),
    (["export", "-model", "--onnx", "m.onnx"], "convattn export: error: the following arguments are required: "
     "model_dir (-model was taken for a flag: a path that starts with \"-\" is given as ./-model)"),
    (["plot", "attention", "-model"], "required: checkpoint (-model was taken for a flag: a path that starts with "
                                      "\"-\" is given as ./-model)"),
]


@pytest.mark.parametrize(("argv", "said"), REJECTED)
def test_a_rejected_value_is_one_line(tmp_path, monkeypatch, capsys, argv, said):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2
    assert len(err.strip().splitlines()) == 1 and "usage:" not in err, err
    assert said in err and "--help)" in err, err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["-1e-3", "-0.5", "-3"])
def test_a_negative_number_is_a_value(tmp_path, monkeypatch, capsys, value):
    """argparse alone reads `--lr -1e-3` as a flag named -1e-3 ("expected one argument"): here the value reaches
    the range check."""
    monkeypatch.chdir(tmp_path)
    assert main(["pretrain", "--lr", value, "--max-steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("convattn pretrain: error: --lr -") and "must be a finite number" in err, err
    assert not any(tmp_path.iterdir())


def test_a_short_write_of_torch_is_said_as_a_full_disk():
    """torch's zip writer reports a write cut short by a full disk as 'unexpected pos' (a checkpoint's save)."""
    from convattn.cli import known_cause

    err = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1536 vs 1430")
    assert "the disk is full; free some space" in known_cause(err)
