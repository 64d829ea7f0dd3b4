"""The study tables' two scripts: benchmarks/step_cost.py (each grid run's training step, timed in one process) and
benchmarks/paired_comparison.py (paired per-seed differences, and with step_cost's costs the same at equal cost).
The time is a fake clock's: nothing here depends on the machine's speed."""

from __future__ import annotations

import csv
import importlib
import itertools
import json
import math
import sys

import datasets
import pytest
import torch

from convattn.data.tokenizer import train_tokenizer

WORDS = "the river city was built on both banks of a wide valley where old roads met".split()  # noqa: SIM905


@pytest.fixture
def step_cost():
    return importlib.import_module("step_cost")


@pytest.fixture
def paired():
    return importlib.import_module("paired_comparison")


def write_metrics(path, curves: dict[str, dict[int, dict[int, float]]]) -> None:
    """A compare run's metrics.csv with the columns paired_comparison reads: run -> seed -> step -> perplexity."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, ["run", "preset", "seed", "step", "perplexity"])
        writer.writeheader()
        for run, seeds in curves.items():
            for seed, steps in seeds.items():
                for step, value in steps.items():
                    writer.writerow({"run": run, "preset": run, "seed": seed, "step": step, "perplexity": value})


def test_a_seed_is_read_between_evaluations_linearly_in_log_perplexity(paired):
    curve = {0: 1000.0, 100: 400.0, 200: 100.0}
    assert paired.at_step(curve, 100) == 400.0
    assert paired.at_step(curve, 150) == pytest.approx(200.0)  # the geometric mean of 400 and 100
    assert paired.at_step(curve, 125) == pytest.approx(math.exp(0.75 * math.log(400) + 0.25 * math.log(100)))
    with pytest.raises(ValueError, match="outside the evaluated steps"):
        paired.at_step(curve, 201)


def test_each_run_is_read_where_it_has_spent_the_cheapest_runs_whole_budget(paired):
    curves = {f"family/{name}": {0: {0: 900.0, 1000: 300.0}, 1: {0: 900.0, 1000: 310.0}}
              for name in ("cheap", "base", "dear")}
    curves["family/short"] = {0: {0: 900.0, 500: 500.0}, 1: {0: 900.0, 600: 480.0}}  # its seeds both reach 500
    costs = {"cheap": 0.5, "base": 1.0, "dear": 2.0, "short": 1.0, "not-run": 0.1}
    steps = paired.equal_cost_steps(curves, costs)
    # budget: min(0.5 x 1000, 1.0 x 1000, 2.0 x 1000, 1.0 x 500) = 500 seconds; a run never reads past its end
    assert steps == {"cheap": 1000, "base": 500, "dear": 250, "short": 500}


def test_the_equal_cost_table_pairs_each_seed_at_each_runs_own_step(paired, tmp_path, benchmark_rows):
    # a, twice b's cost, is read at step 100, b at 200: a's seeds 400 and 500 there against b's 300 and 350
    curves = {"f/a": {0: {0: 1000.0, 100: 400.0, 200: 200.0}, 1: {0: 1000.0, 100: 500.0, 200: 250.0}},
              "f/b": {0: {0: 1000.0, 100: 600.0, 200: 300.0}, 1: {0: 1000.0, 100: 700.0, 200: 350.0}}}
    write_metrics(tmp_path / "metrics.csv", curves)
    (tmp_path / "costs.json").write_text(json.dumps(
        {"baseline": "b", "costs": {"a": {"seconds_per_step": 0.2}, "b": {"seconds_per_step": 0.1}},
         "commit": "abc1234", "command": "python benchmarks/step_cost.py --runs a,b"}))
    sys_argv = ["paired_comparison.py", str(tmp_path), "--pairs", "a:b", "--costs", str(tmp_path / "costs.json"),
                "--out", str(tmp_path / "out")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", sys_argv)
        paired.main()
    text = (tmp_path / "out" / "paired.md").read_text()
    # at equal steps a is better on both seeds; at equal cost worse on both
    assert "| a - b | 200 | -100.0, -100.0 | -100.0 ± 0.0 | 2/2 | 100 |" in text
    assert "| a | 2.00x | 100 | 450.0 ± 50.0 | 400.0, 500.0 |" in text
    assert "| b | 1.00x | 200 | 325.0 ± 25.0 | 300.0, 350.0 |" in text
    assert "| a - b | +100.0, +150.0 | +125.0 ± 25.0 | 2/2 |" in text
    # the table names the measurement it rests on
    assert f"from `{tmp_path / 'costs.json'}`, commit abc1234: `python benchmarks/step_cost.py --runs a,b`" in text
    row = json.loads((benchmark_rows / "paired_comparison.jsonl").read_text().splitlines()[-1])
    assert {"equal_cost_pair": "a - b", "differences": {"0": 100.0, "1": 150.0}, "mean": 125.0, "sem": 25.0,
            "agreeing": 2} in row["figures"]


def test_the_cost_column_divides_by_the_named_baseline_not_the_cheapest_run(paired, tmp_path, benchmark_rows):
    curves = {"f/a": {0: {0: 1000.0, 100: 400.0, 200: 200.0}}, "f/b": {0: {0: 1000.0, 100: 600.0, 200: 300.0}}}
    write_metrics(tmp_path / "metrics.csv", curves)
    (tmp_path / "costs.json").write_text(json.dumps(
        {"baseline": "a", "costs": {"a": {"seconds_per_step": 0.2}, "b": {"seconds_per_step": 0.1}}}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["paired_comparison.py", str(tmp_path), "--pairs", "a:b", "--costs",
                                    str(tmp_path / "costs.json"), "--out", str(tmp_path / "out")])
        paired.main()
    text = (tmp_path / "out" / "paired.md").read_text()
    assert "| a | 1.00x | 100 |" in text and "| b | 0.50x | 200 |" in text


@pytest.mark.parametrize(("diffs", "onset"), [
    # every seed below zero from step 100 on (step 0, the initialisation, never counts)
    ({0: {0: 1.0, 1: 1.0}, 100: {0: -1.0, 1: -2.0}, 200: {0: -1.0, 1: -1.0}}, 100),
    # a later evaluation where one seed crosses starts the count again
    ({100: {0: -1.0, 1: -2.0}, 200: {0: -1.0, 1: 2.0}, 300: {0: -1.0, 1: -1.0}, 400: {0: -3.0, 1: -1.0}}, 300),
    # an evaluation that lacks a seed does not show every seed agreeing
    ({100: {0: -1.0, 1: -2.0}, 200: {0: -1.0}, 300: {0: -1.0, 1: -1.0}}, 300),
    # the last evaluation disagrees: no onset
    ({100: {0: -1.0, 1: -2.0}, 200: {0: -1.0, 1: 0.0}}, None),
])
def test_the_onset_is_where_every_later_evaluation_has_every_seed_on_one_side(paired, diffs, onset):
    assert paired.ordering_onset(diffs, sign=-1.0, seeds=2) == onset


def test_a_cost_file_of_other_runs_is_refused_in_one_line(paired, tmp_path, capsys):
    write_metrics(tmp_path / "metrics.csv", {"f/a": {0: {0: 9.0, 10: 5.0}}, "f/b": {0: {0: 9.0, 10: 6.0}}})
    (tmp_path / "costs.json").write_text(json.dumps({"baseline": "x", "costs": {"x": {"seconds_per_step": 1.0}}}))
    (tmp_path / "other.json").write_text("{}")
    for costs, said in (("costs.json", "none of its runs (x) is in"), ("other.json", "not benchmarks/step_cost.py")):
        with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit):
            patch.setattr(sys, "argv", ["paired_comparison.py", str(tmp_path), "--pairs", "a:b", "--costs",
                                        str(tmp_path / costs)])
            paired.main()
        assert said in capsys.readouterr().err


def test_every_run_trains_one_step_and_the_baseline_is_timed_first(step_cost, tmp_path, monkeypatch,
                                                                    benchmark_rows):
    ticks = itertools.count()
    monkeypatch.setattr(step_cost.harness.time, "perf_counter", lambda: float(next(ticks)))  # every call 1 s
    output = tmp_path / "cost.md"
    monkeypatch.setattr(sys, "argv", ["step_cost.py", "--runs", "alibi,convbert", "--baseline", "rotary",
                                      "--layers", "1", "--hidden", "32", "--heads", "2", "--intermediate", "64",
                                      "--vocab-size", "50", "--batch-size", "2", "--seq-len", "24", "--reps", "1",
                                      "--output", str(output)])
    assert step_cost.main() == 0
    costs = json.loads(output.with_suffix(".json").read_text())
    assert costs["baseline"] == "rotary" and list(costs["costs"]) == ["rotary", "alibi", "convbert"]
    assert all(cost["seconds_per_step"] == 1.0 and cost["ratio"] == 1.0 for cost in costs["costs"].values())
    rows = [line for line in output.read_text().splitlines() if line.startswith("| convbert |")]
    assert len(rows) == 1 and rows[0].endswith("M | 1,000 [1,000, 1,000] | 1.00 |")
    assert (benchmark_rows / "step_cost.jsonl").exists()


def test_each_cost_is_a_median_and_each_ratio_divides_medians(step_cost, tmp_path, monkeypatch, benchmark_rows):
    ticks = itertools.count()
    # the clock reads i**2 at its i-th call: every timed call lasts longer than the one before
    monkeypatch.setattr(step_cost.harness.time, "perf_counter", lambda: float(next(ticks)) ** 2)
    output = tmp_path / "cost.md"
    monkeypatch.setattr(sys, "argv", ["step_cost.py", "--runs", "alibi", "--baseline", "rotary", "--layers", "1",
                                      "--hidden", "32", "--heads", "2", "--intermediate", "64", "--vocab-size", "50",
                                      "--batch-size", "2", "--seq-len", "24", "--reps", "3", "--output", str(output)])
    assert step_cost.main() == 0
    costs = json.loads(output.with_suffix(".json").read_text())["costs"]
    for cost in costs.values():
        assert cost["least"] < cost["seconds_per_step"] < cost["most"]
        assert cost["ratio"] == pytest.approx(cost["seconds_per_step"] / costs["rotary"]["seconds_per_step"])
    assert costs["alibi"]["ratio"] > 1  # timed after the baseline within each repetition


def test_a_step_trains_the_model_on_each_batch_in_turn(step_cost):
    fields = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
              "vocab_size": 50}
    batches = step_cost.random_batches(50, 2, 24) + step_cost.random_batches(50, 2, 16, seed=1)
    seen = []
    step, model = step_cost.build("chang2021-small/composite", fields, batches)
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[1]),
                                    with_kwargs=True)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):
        step()
    assert seen == [24, 16, 24]
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True) if b.requires_grad)
    assert step_cost.encoder_parameters(model) == sum(p.numel() for p in model.convattn.parameters())


def test_corpus_batches_are_the_pretraining_collators_pairs(step_cost, tmp_path, monkeypatch):
    lines = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(3 + i % 11)) for i in range(400)]
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    tokenizer = train_tokenizer(datasets.Dataset.from_dict({"text": lines}), vocab_size=60, max_length=512)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    monkeypatch.setattr("convattn.training.pretrain.options.default_cache_dir", lambda: tmp_path / "cache")
    batches, vocab = step_cost.corpus_batches(str(tmp_path / "train.txt"), str(tmp_path / "tokenizer"), "pairs",
                                              batch=4, n=16, count=3)
    assert vocab == len(tokenizer) and len(batches) == 3
    for batch in batches:
        assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
        width = batch["input_ids"].shape[1]
        assert width <= 16 and width % 8 == 0  # cut to --seq-len, padded to a multiple of 8
        assert (batch["input_ids"][:, 0] == tokenizer.cls_token_id).all()
        assert (batch["token_type_ids"] == 1).any()  # two lines per example
        assert ((batch["labels"] != -100) <= batch["attention_mask"].bool()).all()  # no pad is labelled
    with pytest.raises(SystemExit, match="fewer than --batches x --batch-size"):
        step_cost.corpus_batches(str(tmp_path / "train.txt"), str(tmp_path / "tokenizer"), "pairs", batch=64,
                                 n=16, count=10)


def test_glue_over_seeds_averages_fine_tuning_seeds_inside_each_pretraining_seed(tmp_path, benchmark_rows,
                                                                                   monkeypatch):
    """A cell is the mean ± SEM over pretraining seeds of each seed's mean over its fine-tuning seeds; the last
    column the mean of the tasks per pretraining seed; a folder without results is refused naming it."""
    import argparse

    glue = importlib.import_module("glue_over_seeds")
    folders = []
    for seed, (cola, sst) in enumerate([(4.0, 80.0), (8.0, 78.0)]):
        folder = tmp_path / f"seed{seed}"
        folder.mkdir()
        columns = {"CoLA": {"mean": cola, "per_seed": {"0": cola - 1, "1": cola + 1}},
                   "SST": {"mean": sst, "per_seed": {"0": sst, "1": sst}}}
        (folder / "glue_results.json").write_text(json.dumps({"columns": columns}))
        folders.append(str(folder))
    monkeypatch.setattr(sys, "argv", ["glue_over_seeds.py", "--row", f"composite={','.join(folders)}",
                                      "--row", f"one={folders[0]}", "--output", "glue.md"])
    assert glue.main() == 0
    table = (benchmark_rows / "glue.md").read_text().splitlines()[-2:]
    # CoLA 6 ± 2 (the SEM of 4 and 8), SST 79 ± 1, the tasks' mean per seed 42 and 43: 42.5 ± 0.5
    assert table[0] == "| composite | 2 | 6.0 ± 2.0 | 79.0 ± 1.0 | 42.5 ± 0.5 |", table
    assert table[1] == "| one | 1 | 4.0 | 80.0 | 42.0 |", table
    row = json.loads((benchmark_rows / "glue_over_seeds.jsonl").read_text())
    figure = row["figures"][0]
    assert figure["row"] == "composite" and figure["CoLA"]["values"] == [4.0, 8.0]
    assert figure["mean of the tasks"]["mean"] == 42.5
    with pytest.raises(argparse.ArgumentTypeError, match=r"nothing has no glue_results\.json"):
        glue.row_argument("x=" + str(tmp_path / "nothing"))
