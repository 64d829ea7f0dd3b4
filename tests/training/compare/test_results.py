"""What a comparison reports of its runs, read back from their folders (results.py), on synthetic run folders and
results: which seeds count (the finished ones), the step each reached and the tokens it saw, the step-time
spread, the GPU's peak and how many seeds the folder holds."""

from __future__ import annotations

import json

import pytest

from convattn.runs.pretrain import FINAL_MODEL, METRICS_FILE
from convattn.training.compare.grids import Grid, RunSpec
from convattn.training.compare.options import CompareOptions
from convattn.training.compare.results import RunResult, collect_results, seeds_in_output

SPEC = RunSpec("bert", "chang2021-small/absolute")


def options_for(folder, seeds=3) -> CompareOptions:
    return CompareOptions(Grid("g", [SPEC]), folder, data={}, seeds=seeds)


def write_run(options: CompareOptions, seed: int, evaluations: list[tuple[int, float, int]], finished: bool) -> None:
    """A seed's folder: its metrics (step, perplexity, tokens seen per evaluation), and the final model if it
    finished (what makes a run finished)."""
    path = options.run_path(SPEC, seed)
    path.mkdir(parents=True)
    rows = [{"step": step, "perplexity": perplexity, "tokens_seen": tokens} for step, perplexity, tokens in evaluations]
    (path / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    if finished:
        (path / FINAL_MODEL).write_bytes(b"")


def test_only_finished_seeds_count_and_their_last_evaluation_is_what_they_reached(tmp_path):
    """Under a time budget seeds stop at different steps; a seed still running (here further on, and better) is in
    the curves' data but not in the reported perplexity, step or tokens."""
    options = options_for(tmp_path)
    write_run(options, 0, [(100, 50.0, 1000), (200, 40.0, 2000)], finished=True)
    write_run(options, 1, [(90, 52.0, 900), (180, 44.0, 1800)], finished=True)
    write_run(options, 2, [(150, 30.0, 1500), (300, 10.0, 3000)], finished=False)
    [result] = collect_results(options)
    assert result.finished == [0, 1] and sorted(result.metrics) == [0, 1, 2] and result.curve_seeds == [0, 1]
    assert result.final_perplexity["mean"] == pytest.approx(42.0)
    assert result.final_step == 200  # the furthest a finished seed reached
    assert result.steps_reached == pytest.approx(190.0) and result.tokens_seen == pytest.approx(1900.0)


def test_the_step_spread_takes_the_median_of_the_medians_and_the_extremes():
    spreads = [{"p10": 0.8, "median": 1.0, "p90": 1.5}, {"p10": 1.5, "median": 2.0, "p90": 2.5},
               {"p10": 7.0, "median": 9.0, "p90": 12.0}]
    metrics = {0: [{"step": 10, "perplexity": 5.0, "step_seconds": spread} for spread in spreads]}
    result = RunResult(SPEC, metrics, [0], None, {})
    assert result.step_seconds == {"p10": 0.8, "median": 2.0, "p90": 12.0}  # not the mean, 4.0


def test_the_gpu_peak_is_the_largest_devices():
    result = RunResult(SPEC, {}, [], {"cuda_peak_bytes": {"cuda:0": 100, "cuda:1": 300, "cuda:2": 200}}, {})
    assert result.cuda_peak == 300
    assert RunResult(SPEC, {}, [], None, {}).cuda_peak is None


def test_the_seeds_a_folder_holds_count_up_to_the_highest_one(tmp_path):
    """A comparison whose seed 1 was removed still has three seeds' places: the next run fills seed 1 again."""
    options = options_for(tmp_path)
    assert seeds_in_output(options) == 0
    for seed in (0, 2):
        write_run(options, seed, [(10, 5.0, 100)], finished=True)
    assert seeds_in_output(options) == 3
