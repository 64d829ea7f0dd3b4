"""The comparison's perplexity figures average per-seed curves aligned on one grid (synthetic metrics, no
training): under a time budget seeds evaluate at different steps."""

import statistics

import pytest
from helpers.pretrain import TINY, main_offline, write_corpus

from convattn.training.compare import report as report_module
from convattn.training.compare.curves import align_seeds
from convattn.training.compare.grids import Grid, RunSpec
from convattn.training.compare.options import CompareOptions
from convattn.training.compare.report import write_report
from convattn.training.compare.results import (
    RunResult,
    collect_results,
    perplexity_cost_figure,
    perplexity_figure,
)

BUDGET = 600.0


def timed_rows(seed: int) -> list[dict]:
    """Ten evaluations on the budget's grid; seed 1 takes slower steps (fewer of them), and each evaluation lands
    a little past its grid line (the step that crossed it), the last past the deadline."""
    steps_per_evaluation = (100, 83)[seed]
    rows = []
    for k in range(1, 11):
        rows.append({"step": k * steps_per_evaluation, "perplexity": 3000 / k + 40 * seed + 7 * (k % 3),
                     "tokens_seen": k * steps_per_evaluation * 512,
                     "training_seconds": k * BUDGET / 10 + (0.3, 0.8)[seed] + 0.1 * k})
    return rows


def timed_result(name: str = "bert") -> RunResult:
    return RunResult(RunSpec(name, "chang2021-small/absolute"), {0: timed_rows(0), 1: timed_rows(1)}, [0, 1],
                     None, {})


def final_mean(result: RunResult) -> float:
    return statistics.fmean(result.metrics[seed][-1]["perplexity"] for seed in result.finished)


def test_the_band_is_the_mean_and_range_of_three_seeds_not_their_median():
    seeds = [[(0, 100.0), (10, 10.0)], [(0, 100.0), (10, 20.0)], [(0, 100.0), (10, 60.0)]]
    band = align_seeds(seeds)
    assert band.mean[-1] == pytest.approx(30.0) and (band.low[-1], band.high[-1]) == pytest.approx((10.0, 60.0))


def test_aligned_mean_ends_at_the_mean_of_coinciding_final_evaluations():
    a = [(0, 100.0), (10, 50.0), (20, 20.0)]
    b = [(0, 120.0), (7, 70.0), (14, 40.0), (20, 30.0)]
    band = align_seeds([a, b])
    assert band.x == [0, 7, 10, 14, 20]
    assert band.mean[-1] == pytest.approx(25.0) and band.mean[0] == pytest.approx(110.0)
    # at each grid point the band is the min and max of the seeds' (interpolated) values
    for low, mean, high in zip(band.low, band.mean, band.high, strict=True):
        assert low <= mean <= high
    assert (band.low[-1], band.high[-1]) == pytest.approx((20.0, 30.0))
    assert (band.low[2], band.high[2]) == pytest.approx((50.0, 55.0), rel=0.02)


def test_aligned_grid_is_the_range_all_seeds_cover():
    band = align_seeds([[(0, 9.0), (10, 5.0), (30, 2.0)], [(5, 8.0), (20, 4.0)]])
    assert band.x == [5, 10, 20] and band.high[-1] == pytest.approx(4.0)
    assert align_seeds([[(0, 9.0), (1, 8.0)], [(2, 7.0), (3, 6.0)]]) is None


def test_of_two_points_at_one_x_the_later_evaluation_counts():
    # the time figure clamps each evaluation to the deadline: the one that crossed it and any after share that x
    band = align_seeds([[(1.0, 500.0), (10.0, 300.0), (10.0, 280.0)], [(1.0, 520.0), (10.0, 290.0)]])
    assert band.x == [1.0, 10.0] and (band.mean[-1], band.low[-1]) == pytest.approx((285.0, 280.0))


def test_time_budget_figure_ends_at_the_reported_mean_with_a_min_max_band():
    result = timed_result()
    fig = perplexity_cost_figure([result], "test", BUDGET)
    by_time, by_tokens = fig.axes[:2]
    line = by_time.get_lines()[0]
    assert line.get_xdata()[-1] == pytest.approx(BUDGET / 60)  # the clock stops at the deadline
    assert line.get_ydata()[-1] == pytest.approx(final_mean(result))
    # the band at the deadline spans the seeds' final values
    band = by_time.collections[0].get_paths()[0].vertices
    at_deadline = sorted({round(y, 6) for x, y in band if x == pytest.approx(BUDGET / 60)})
    finals = sorted(result.metrics[seed][-1]["perplexity"] for seed in (0, 1))
    assert [at_deadline[0], at_deadline[-1]] == pytest.approx(finals)
    # tokens: the seeds cover up to the slower seed's last evaluation
    assert by_tokens.get_lines()[0].get_xdata()[-1] == 10 * 83 * 512


def test_step_figure_averages_seeds_on_common_steps_only():
    result = timed_result()
    line = perplexity_figure([result], "test").axes[0].get_lines()[0]
    steps = list(line.get_xdata())
    assert steps == sorted(steps) and steps[-1] == 830 and steps[0] == 100  # the range both seeds reach
    seed1_final = result.metrics[1][-1]["perplexity"]
    assert line.get_ydata()[-1] != pytest.approx(seed1_final)  # not one seed's value


def test_a_time_budget_report_has_the_time_and_tokens_figure(tmp_path, monkeypatch):
    options = CompareOptions(Grid("g", [RunSpec("bert", "chang2021-small/absolute")]), tmp_path, data={},
                             seeds=2, training={"time_budget": BUDGET})
    monkeypatch.setattr(report_module, "collect_results", lambda _options: [timed_result()])
    _results, folder = write_report(options)
    assert (folder / "perplexity_cost.png").read_bytes()[:4] == b"\x89PNG"
    assert "](perplexity_cost.png)" in (folder / "report.md").read_text()
    assert 'src="perplexity_cost.png"' in (folder / "report.html").read_text()


def test_a_step_budget_report_has_no_time_figure(tmp_path, monkeypatch):
    options = CompareOptions(Grid("g", [RunSpec("bert", "chang2021-small/absolute")]), tmp_path, data={}, seeds=2,
                             training={"max_steps": 1000})
    monkeypatch.setattr(report_module, "collect_results", lambda _options: [timed_result()])
    _results, folder = write_report(options)
    assert (folder / "perplexity.png").is_file() and not (folder / "perplexity_cost.png").exists()


@pytest.mark.slow
@pytest.mark.timing
def test_a_two_seed_time_budget_comparison_plots_its_reported_mean(tmp_path_factory, capsys, step_clock):
    corpus = write_corpus(tmp_path_factory.mktemp("corpus"))
    out = tmp_path_factory.mktemp("compare") / "out"
    tiny = [arg for i, arg in enumerate(TINY) if not {arg, TINY[i - 1]} & {"--max-steps", "--warmup", "--preset"}]
    args = ["compare", "--presets", "chang2021-small/absolute", "--seeds", "2", *tiny, "--train-file",
            str(corpus / "train.txt"), "--eval-file", str(corpus / "valid.txt"), "--output-dir", str(out),
            "--time-budget", "2s", "--warmup", "0.2"]
    assert main_offline(args, tmp_path_factory) == 0
    assert "](perplexity_cost.png)" in (out / "report.md").read_text()
    options = CompareOptions(Grid("g", [RunSpec("chang2021-small/absolute", "chang2021-small/absolute")]), out,
                             data={}, seeds=2)
    [result] = collect_results(options)
    assert result.finished == [0, 1] and all("training_seconds" in row for row in result.metrics[0])
    line = perplexity_cost_figure([result], "test", 2.0).axes[0].get_lines()[0]
    assert line.get_ydata()[-1] == pytest.approx(result.final_perplexity["mean"], rel=1e-6)
