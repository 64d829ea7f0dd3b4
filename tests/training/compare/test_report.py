"""The comparison's report built from synthetic results and the options its runs saved (report.py), without
training: which columns a budget shows, which row is bold, what a seed's cell says, the settings' wording, where a
subset's report goes, and when a run is called slowed."""

from __future__ import annotations

import json

import pytest

from convattn.files import write_json_atomic
from convattn.runs.pretrain import DATA_FILE, OPTIONS_FILE
from convattn.training.compare.cells import clear_winner, count, html_cell, markdown_table
from convattn.training.compare.grids import Grid, RunSpec
from convattn.training.compare.options import CompareOptions, run_options
from convattn.training.compare.report import REPORT_RUNS, SLOWED_ROW, Report, report_dir, slowed
from convattn.training.compare.results import RunResult
from convattn.training.seed_statistics import mean_sem

SPECS = [RunSpec("absolute", "chang2021-small/absolute"), RunSpec("composite", "chang2021-small/composite")]


def comparison(folder, **saved) -> CompareOptions:
    """Two runs of two seeds whose seed-0 folders hold the options they trained with: the defaults for 50 steps,
    changed by `saved` (a key set to None is removed, as an older run's file lacks it)."""
    options = CompareOptions(Grid("g", SPECS), folder, data={}, seeds=2, training={"max_steps": 50})
    for spec in SPECS:
        recorded = run_options(options, spec, 0).to_json()
        recorded.update(saved)
        recorded = {key: value for key, value in recorded.items() if value is not None or key not in saved}
        options.run_path(spec, 0).mkdir(parents=True)
        write_json_atomic(options.run_path(spec, 0) / OPTIONS_FILE, recorded)
    return options


def evaluations(*perplexities: float, slowed: float | None = None) -> list[dict]:
    """Evaluations every 50 steps with these perplexities (and this share of slowed steps)."""
    rows = [{"step": 50 * (k + 1), "perplexity": p, "tokens_seen": 1000 * (k + 1)} for k, p in enumerate(perplexities)]
    return [{**row, "slowed_steps": slowed} if slowed is not None else row for row in rows]


def results(absolute=(40.0, 41.0), composite=(30.0, 31.0), slowed: float | None = None) -> list[RunResult]:
    """absolute and composite, both seeds finished, with these final perplexities."""
    return [RunResult(spec, {0: evaluations(90.0, a, slowed=slowed), 1: evaluations(95.0, b, slowed=slowed)},
                      [0, 1], None, {}) for spec, (a, b) in zip(SPECS, (absolute, composite), strict=True)]


def settings(report: Report) -> dict[str, str]:
    return dict(report.settings())


def test_a_step_budget_shows_no_steps_or_tokens_columns_and_bolds_the_clear_winner(tmp_path):
    report = Report(comparison(tmp_path), results(), figure="perplexity.png")
    assert not report.timed and report.cost_figure is None
    assert "Steps reached" not in report.columns() and "Tokens seen" not in report.columns()
    ppl = report.columns().index("Eval perplexity (mean ± std)")
    rows = report.rows()
    assert not rows[0][ppl].startswith("**") and rows[1][ppl].startswith("**")  # composite's, the second row
    assert [row[report.columns().index("Seeds done")] for row in rows] == ["2/2", "2/2"]


def test_a_time_budget_shows_what_each_run_bought_and_its_figure_only_with_curves(tmp_path):
    options = comparison(tmp_path, time_budget=600.0)
    report = Report(options, results(), figure="perplexity.png")
    assert report.timed and report.budget == 600.0 and report.cost_figure == "perplexity_cost.png"
    assert {"Steps reached", "Tokens seen"} <= set(report.columns())
    assert Report(options, results(), figure=None).cost_figure is None  # no curves, no figure of them


def test_a_seed_still_running_is_marked_in_its_cell_and_not_counted_done(tmp_path):
    result = RunResult(SPECS[0], {0: evaluations(90.0, 40.0), 1: evaluations(95.0)}, [0], None, {})
    report = Report(comparison(tmp_path), [result, results()[1]], figure=None)
    _, rows = report.seed_rows()
    assert rows[0][1:] == ["40.00", "95.00 (step 50, unfinished)"]
    assert report.rows()[0][report.columns().index("Seeds done")] == "1/2"


def test_the_settings_say_the_warmup_the_evaluations_and_the_clock_as_the_runs_saved_them(tmp_path):
    said = settings(Report(comparison(tmp_path / "a", warmup=1, eval_every=100), results(), figure=None))
    assert "warmup 1 step(s)" in said["budget (every run)"]
    assert said["evaluation"].startswith("every 50 steps")  # eval_every past max_steps: at the end only
    said = settings(Report(comparison(tmp_path / "b", warmup=0.1), results(), figure=None))
    assert "warmup 10% of the steps" in said["budget (every run)"]
    # a time-budget run recorded before the clock was a choice counted the wall's time
    legacy = Report(comparison(tmp_path / "c", time_budget=600.0, budget_clock=None), results(), figure=None)
    assert legacy.clock == "wall" and "10 min of training wall-clock time" in settings(legacy)["budget (every run)"]


def test_eval_text_overlapping_training_text_is_said_only_where_the_data_record_says_so(tmp_path):
    options = comparison(tmp_path)
    record = options.run_path(SPECS[0], 0) / DATA_FILE
    record.write_text(json.dumps({"eval_overlap": None, "train_files": []}))
    assert Report(options, results(), figure=None).eval_overlap() == ""
    record.write_text(json.dumps({"eval_overlap": "eval text is training text: 12 of 12 lines"}))
    assert Report(options, results(), figure=None).eval_overlap() == " (eval text is training text: 12 of 12 lines)"


def test_a_run_is_called_slowed_above_the_threshold_and_the_advice_follows_the_clock(tmp_path):
    assert slowed(SLOWED_ROW) == "10%" and slowed(0.11) == "11% (slowed)" and slowed(None) == "–"
    quiet, busy = (results(slowed=share) for share in (0.05, 0.5))
    assert not any("slowed by other processes" in line
                   for line in Report(comparison(tmp_path / "q"), quiet, figure=None).summary_lines())
    for clock, advice in (("compute", False), ("wall", True)):
        options = comparison(tmp_path / clock, time_budget=600.0, budget_clock=clock)
        [line] = [line for line in Report(options, busy, figure=None).summary_lines() if "slowed" in line]
        assert "absolute (50% of steps)" in line and ("again on a quiet machine" in line) == advice


@pytest.mark.parametrize(("covered", "inside"), [(1, True), (2, True), (3, False)])
def test_a_subsets_report_goes_aside_only_when_the_folders_report_covers_other_runs(tmp_path, covered, inside):
    """The folder's report covered the first run, both, or both and another: this report of both replaces it in
    the first two cases, and goes to subsets/ in the third (the fuller report stays)."""
    options = CompareOptions(Grid("g", SPECS), tmp_path, data={}, seeds=1)
    write_json_atomic(tmp_path / REPORT_RUNS, [spec.slug for spec in SPECS][:covered] + ["another"] * (covered > 2))
    assert (report_dir(options) == tmp_path) == inside


def test_a_winners_band_lies_wholly_below_the_others_and_touching_bands_name_none():
    """mean ± std over seeds: 10 ± 1 against 13 ± 1 wins; against 12 ± 1 the bands touch at 11: no clear winner."""
    assert clear_winner([mean_sem([9.0, 10.0, 11.0]), mean_sem([12.0, 13.0, 14.0])]) == 0
    assert clear_winner([mean_sem([12.0, 13.0, 14.0]), mean_sem([9.0, 10.0, 11.0])]) == 1
    touching = [mean_sem([9.0, 10.0, 11.0]), mean_sem([11.0, 12.0, 13.0])]
    assert touching[0]["mean"] + touching[0]["std"] == touching[1]["mean"] - touching[1]["std"]
    assert clear_winner(touching) is None


def test_cells_count_millions_from_one_million_align_numbers_right_and_carry_bold_into_html():
    assert (count(999_999), count(1_000_000), count(13_090_000), count(None)) == ("1000.0k", "1.00M", "13.09M", "–")
    _, align, row = markdown_table(["Run", "Preset (+ run fields)", "Tokens/s"], [["a", "b", "1,000"]])
    assert align == "|---|---|---:|" and row == "| a | b | 1,000 |"
    assert html_cell("**30.00 ± 0.71**") == "<strong>30.00 ± 0.71</strong>" and html_cell("a<b") == "a&lt;b"
