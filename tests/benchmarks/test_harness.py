"""benchmarks/harness.py, what every benchmark shares: a run's row (its command, commit, machine and figures,
appended as one JSON line), interleaved timing, the baselines' shapes and the kernel's operands. Nothing here
asserts a time."""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def harness(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as the scripts import it
    return importlib.import_module("harness")


def test_a_run_appends_one_row_with_its_command_commit_machine_and_figures(harness, benchmark_rows, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["benchmarks/attention_layer.py", "--shapes", "64x2", "--note", "a b"])
    for reps in (1, 2):
        with harness.Run("example", machine="a machine", reps=reps) as run:
            run.add(arm="none", ms=1.0)
    lines = (benchmark_rows / "example.jsonl").read_text().splitlines()
    assert len(lines) == 2
    row = json.loads(lines[1])
    assert list(row) == ["benchmark", "command", "commit", "machine", "date", "reps", "figures"]
    assert row["command"] == "python benchmarks/attention_layer.py --shapes 64x2 --note 'a b'"
    assert re.fullmatch(r"[0-9a-f]{4,}(\+changes)?|unknown", row["commit"])
    assert row["machine"] == "a machine" and row["reps"] == 2 and row["figures"] == [{"arm": "none", "ms": 1.0}]


def test_a_run_that_fails_keeps_what_it_measured_and_says_why(harness, benchmark_rows):
    with pytest.raises(ZeroDivisionError), harness.Run("failing", machine="-") as run:
        run.add(n=1)
        1 / 0  # noqa: B018
    row = json.loads((benchmark_rows / "failing.jsonl").read_text())
    assert row["figures"] == [{"n": 1}] and row["unfinished"].startswith("ZeroDivisionError")


def test_a_run_stopped_before_it_measured_anything_leaves_no_row(harness, benchmark_rows):
    with pytest.raises(SystemExit), harness.Run("stopped", machine="-"):
        raise SystemExit(2)  # argparse's error
    assert not (benchmark_rows / "stopped.jsonl").exists()


def test_replacing_a_report_that_results_quotes_says_so_in_one_line(harness, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(harness, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(harness, "RESULTS_MD", tmp_path / "RESULTS.md")
    (tmp_path / "RESULTS.md").write_text("costs in [`results/cost.md`](results/cost.md); results/other.md unlinked\n")
    (tmp_path / "results").mkdir()
    quoted, other, elsewhere = tmp_path / "results" / "cost.md", tmp_path / "results" / "other.md", tmp_path / "x.md"
    for path in (quoted, other, elsewhere):
        harness.report(path, ["first"], quiet=True)  # new files: nothing quoted was replaced
    assert capsys.readouterr().err == ""
    for path in (other, elsewhere):
        harness.report(path, ["again"], quiet=True)
    assert capsys.readouterr().err == ""
    harness.report(quoted, ["again"], quiet=True)
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and "RESULTS.md quotes results/cost.md" in said[0]
    assert "git checkout -- benchmarks/results/cost.md" in said[0] and quoted.read_text() == "again\n"


def test_the_machine_line_names_the_cpu_the_packages_and_the_threads(harness):
    import torch

    from convattn.denormals import set_denormals
    from convattn.runs.environment import cpu_name

    set_denormals(False)  # (the conftest's keep_denormals gives the process's state back)
    line = harness.machine_line(packages=("torch", "no_such_package"))
    assert line == (f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, no no_such_package, "
                    f"{torch.get_num_threads()} threads, denormals kept")
    set_denormals(True)
    assert harness.machine_line(threads=False).endswith(", denormals flushed")
    assert harness.machine_line("a GPU", threads=False, extra=("bfloat16",)) == (
        f"a GPU, torch {torch.__version__}, bfloat16")


def test_a_benchmark_flushes_denormals_as_the_command_line_does_unless_told_to_keep_them(harness):
    from convattn.denormals import denormals_flushed, set_denormals

    set_denormals(False)  # (the conftest's keep_denormals gives the process's state back)
    assert harness.arguments("doc", reps=3).parse_args(["--keep-denormals"]).reps == 3
    assert not denormals_flushed()
    harness.arguments("doc").parse_args([])
    assert denormals_flushed()


def test_interleaved_timing_gives_each_arm_its_repetitions_in_turn(harness):
    order = []
    times = harness.interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, reps=3, warmup=1)
    assert order == ["a", "b"] * 4 and {name: len(values) for name, values in times.items()} == {"a": 3, "b": 3}
    spread = harness.Spread.of([3.0, 1.0, 2.0, 30.0, 2.5])  # the median: one slow repetition does not move it
    assert (spread.median, spread.least, spread.most, spread.count) == (2.5, 1.0, 30.0, 5)
    assert spread.ms() == "2500 [1000, 30000]"


def test_the_reported_times_are_the_median_repetition_and_the_fastest_round(harness, monkeypatch):
    """On a fake clock each call advances: time_interleaved reports each arm's median repetition (after the warm-up),
    least_per_call the mean call of its fastest round (the machine's other work only adds)."""
    now = [0.0]
    monkeypatch.setattr(harness.time, "perf_counter", lambda: now[0])

    def taking(*seconds):
        durations = iter(seconds)
        return lambda: now.__setitem__(0, now[0] + next(durations))

    assert harness.time_interleaved({"a": taking(100.0, 1.0, 2.0, 30.0)}, reps=3, warmup=1) == {"a": 2.0}
    assert harness.least_per_call(taking(9.0, 5.0, 5.0, 1.0, 3.0, 4.0, 4.0), calls=2, rounds=3, warmup=1) == 2.0


def test_the_bert_baseline_has_the_convattn_models_shape_with_sdpa(harness):
    from convattn import ConvAttnConfig

    config = ConvAttnConfig.from_preset("chang2021-small/composite", attention_probs_dropout_prob=0.0)
    bert = harness.bert_config(config, max_position_embeddings=512)
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        assert getattr(bert, name) == getattr(config, name), name
    assert bert.attention_probs_dropout_prob == 0.0 and bert.max_position_embeddings == 512
    assert bert._attn_implementation == "sdpa"


def test_the_kernels_operands_add_one_feature_at_a_time(harness):
    import torch

    q, *_, row, key, keep, p = harness.kernel_operands((), 2, 3, 16, 8, reach=2, dtype=torch.float32)
    assert q.shape == (2, 3, 16, 8) and q.stride()[1] == 8 and (row, key, keep, p) == (None, None, None, 0.0)
    *_, row, key, keep, p = harness.kernel_operands(("row", "key", "padding", "dropout"), 2, 3, 16, 8, reach=2,
                                                    dtype=torch.float32)
    assert row.shape == key.shape == (2, 3, 16, 5) and p == harness.DROPOUT
    assert keep.dtype == torch.bool and keep[0].sum() == 14 and keep[1].all()


def test_every_benchmark_script_appends_its_rows_through_the_harness():
    """A script (a file with a __main__ block) writes its figures as rows of benchmarks/results/ through Run."""
    scripts = [path for path in sorted(BENCHMARKS.glob("*.py")) if '__name__ == "__main__"' in path.read_text()]
    assert len(scripts) >= 15
    silent = [path.name for path in scripts if "harness.Run(" not in path.read_text()]
    assert not silent, f"{silent} append no row: measure through harness.Run"
