"""The comparison's length report (lengths.py) on synthetic run folders, with known scores standing in for
`evaluate_at_lengths`: each seed's scores cached on the lengths, eval files and weights, the table's mean ± SEM over the
finished seeds against a float64 computation, a length some seed could not score shown by its note, the CSV's
exact numbers and the figure's points."""

from __future__ import annotations

import csv
import json
import math

import pytest

from convattn.errors import UsageError
from convattn.files import model_identity
from convattn.runs.pretrain import FINAL_MODEL
from convattn.training import length_eval
from convattn.training.compare import lengths as report
from convattn.training.compare.grids import Grid, RunSpec
from convattn.training.compare.options import CompareOptions
from convattn.training.length_eval import MASK_PROBABILITY, LengthResult

SPECS = [RunSpec("relative", "chang2021-small/composite"), RunSpec("absolute", "chang2021-small/absolute")]
LENGTHS = [16, 64, 256]
CANNOT = "cannot extend: absolute position embeddings stop at 32"
NONE_MASKED = "no token masked in 1 block(s) of 64 tokens: give more eval text"
# run -> seed -> perplexity at each of LENGTHS (None: not scored, for the note's reason); absolute seed 2 unfinished
SCORES = {"relative": {0: [30.3, 41.5, 57.125], 1: [31.0, 44.75, 60.5], 2: [29.5, None, 58.0]},
          "absolute": {0: [20.0, None, None], 1: [22.6, None, None], 2: [1.0, 1.0, 1.0]}}


def note(run: str, value: float | None) -> str:
    return "" if value is not None else (CANNOT if run == "absolute" else NONE_MASKED)


@pytest.fixture
def scored(tmp_path, monkeypatch):
    """A comparison's folder, 3 seeds of each run (absolute's seed 2 unfinished), and the evaluations made."""
    options = CompareOptions(Grid("g", SPECS), tmp_path / "out", data={"eval_files": ["valid.txt"]}, seeds=3)
    for spec in SPECS:
        for seed in range(3):
            path = options.run_path(spec, seed)
            path.mkdir(parents=True)
            if (spec.name, seed) != ("absolute", 2):
                (path / FINAL_MODEL).write_bytes(b"")
    calls = []

    def evaluate_at_lengths(path, files, lengths, **kwargs):
        calls.append((path, files, lengths, kwargs))
        run, seed = next(spec.name for spec in SPECS if spec.slug == path.parent.name), int(path.name[4:])
        values = dict(zip(LENGTHS, SCORES[run][seed], strict=True))
        return [LengthResult(n, values[n], 0 if values[n] is None else 7, 1, note(run, values[n])) for n in lengths]

    monkeypatch.setattr(length_eval, "evaluate_at_lengths", evaluate_at_lengths)
    return options, calls


def request(lengths: list[int], blocks: int | None = length_eval.MAX_BLOCKS) -> report.LengthRequest:
    return report.LengthRequest(lengths, blocks)


def mean_sem_cell(values: list[float]) -> str:
    mean = sum(values) / len(values)
    sem = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
    return f"{mean:.1f} ± {sem:.1f}"


def test_the_report_gives_each_runs_mean_and_sem_over_its_finished_seeds(scored):
    options, _ = scored
    table = report.write_length_report(options, report.LengthRequest(LENGTHS))
    out = options.output_dir
    relative = [[SCORES["relative"][seed][i] for seed in range(3)] for i in range(3)]
    absolute = [SCORES["absolute"][seed][0] for seed in range(2)]
    assert table[2:] == [
        f"| relative | 3 | {mean_sem_cell(relative[0])} | {NONE_MASKED} | {mean_sem_cell(relative[2])} |",
        f"| absolute | 2 | {mean_sem_cell(absolute)} | {CANNOT} | {CANNOT} |"]
    markdown = (out / "lengths.md").read_text()
    assert "\n".join(table) in markdown
    assert f"({round(100 * MASK_PROBABILITY)} % of tokens masked" in markdown  # the share length_eval masks
    with open(out / "lengths.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    expected = {(spec.name, str(seed), str(n)): SCORES[spec.name][seed][i] for spec in SPECS for seed in range(3)
                for i, n in enumerate(LENGTHS) if (spec.name, seed) != ("absolute", 2)}
    assert len(rows) == len(expected)
    for row in rows:
        value = expected[row["run"], row["seed"], row["length"]]
        if value is None:
            assert (row["perplexity"], row["note"]) == ("", note(row["run"], None))
        else:
            assert float(row["perplexity"]) == value and row["note"] == ""


def test_the_figure_plots_each_runs_mean_at_the_lengths_every_seed_scored(scored, monkeypatch):
    options, _ = scored
    figures = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path: figures.append(fig))
    report.write_length_report(options, report.LengthRequest(LENGTHS))
    [figure] = figures
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    # relative's seed 2 had no token masked at 64 (too little text there), not a length it cannot take
    assert sorted(lines) == ["absolute (cannot extend to 64, 256)", "relative (not scored at 64)"]
    relative, absolute = lines["relative (not scored at 64)"], lines["absolute (cannot extend to 64, 256)"]
    assert list(relative.get_xdata()) == [16, 256]
    assert list(relative.get_ydata()) == pytest.approx(
        [sum(SCORES["relative"][seed][i] for seed in range(3)) / 3 for i in (0, 2)], rel=1e-12)
    assert list(absolute.get_xdata()) == [16] and list(absolute.get_ydata()) == pytest.approx([21.3], rel=1e-12)


def test_a_seeds_scores_are_cached_on_its_lengths_eval_files_and_weights(scored):
    """A second report of the same lengths, eval text and model evaluates nothing; other lengths, other eval files
    or the run's weights trained again (pretrain --overwrite into the seed folder) are scored again, not read from
    the cache."""
    options, calls = scored
    path = options.run_path(SPECS[0], 0)
    first = report.seed_scores(path, request([16, 64]), ["valid.txt"])
    assert first == {"lengths": [16, 64], "max_blocks": 64, "files": ["valid.txt"], "model": model_identity(path),
                     "protocol": 3, "results": [{"length": 16, "perplexity": 30.3, "note": "", "masked_tokens": 7},
                                                {"length": 64, "perplexity": 41.5, "note": "", "masked_tokens": 7}]}
    assert json.loads((path / report.LENGTHS_FILE).read_text()) == first
    assert report.seed_scores(path, request([16, 64]), ["valid.txt"]) == first and len(calls) == 1
    report.seed_scores(path, request([16, 64]), ["other.txt"])
    assert len(calls) == 2
    assert report.seed_scores(path, request([16, 256]), ["other.txt"])["results"][1]["perplexity"] == 57.125
    assert [lengths for _, _, lengths, _ in calls] == [[16, 64], [16, 64], [16, 256]]
    assert [kwargs for *_, kwargs in calls] == [{"max_blocks": 64}] * 3
    (path / FINAL_MODEL).write_bytes(b"other weights")
    again = report.seed_scores(path, request([16, 256]), ["other.txt"])
    assert again["model"] == model_identity(path) != first["model"]
    assert len(calls) == 4
    record = json.loads((path / report.LENGTHS_FILE).read_text())
    del record["model"]  # a cache written before it was keyed on the weights
    (path / report.LENGTHS_FILE).write_text(json.dumps(record))
    report.seed_scores(path, request([16, 256]), ["other.txt"])
    assert len(calls) == 5
    record = json.loads((path / report.LENGTHS_FILE).read_text())
    record["protocol"] = 1  # scored by an earlier protocol (masks drawn per length, blocks capped per length)
    (path / report.LENGTHS_FILE).write_text(json.dumps(record))
    report.seed_scores(path, request([16, 256]), ["other.txt"])
    assert len(calls) == 6


def test_lengths_take_stray_commas_and_spaces_but_not_an_empty_list():
    assert report.parse_lengths(" 128, 512,") == [128, 512]
    for text in (",", " , "):  # no length at all: no column to report, not a report without one
        with pytest.raises(UsageError, match=">= 3"):
            report.parse_lengths(text)


def test_a_seeds_scores_are_cached_on_the_text_they_score(scored):
    """--eval-length-blocks: other blocks (all the text, or another count) are scored again, with that count given
    to the evaluation; a cache written before it was keyed on the blocks is scored again too."""
    options, calls = scored
    path = options.run_path(SPECS[0], 0)
    report.seed_scores(path, request([16, 64]), ["valid.txt"])
    whole = report.seed_scores(path, request([16, 64], None), ["valid.txt"])
    assert whole["max_blocks"] is None and json.loads((path / report.LENGTHS_FILE).read_text()) == whole
    report.seed_scores(path, request([16, 64], None), ["valid.txt"])
    report.seed_scores(path, request([16, 64], 200), ["valid.txt"])
    assert [kwargs for *_, kwargs in calls] == [{"max_blocks": 64}, {"max_blocks": None}, {"max_blocks": 200}]
    record = json.loads((path / report.LENGTHS_FILE).read_text())
    del record["max_blocks"]
    (path / report.LENGTHS_FILE).write_text(json.dumps(record))
    report.seed_scores(path, request([16, 64], 200), ["valid.txt"])
    assert len(calls) == 4


@pytest.mark.parametrize(("blocks", "says"), [(64, "its first 64 blocks of 256 tokens (--eval-length-blocks)"),
                                               (None, "valid.txt, all of it:")])
def test_the_report_says_which_text_it_scored_and_how_many_tokens_were_masked(scored, blocks, says):
    options, _ = scored
    report.write_length_report(options, request(LENGTHS, blocks))
    assert says in (options.output_dir / "lengths.md").read_text()
    with open(options.output_dir / "lengths.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {row["masked_tokens"] for row in rows if row["perplexity"]} == {"7"}
    assert {row["masked_tokens"] for row in rows if not row["perplexity"]} == {"0"}


def test_blocks_are_a_positive_count_or_all():
    assert report.parse_blocks("200") == 200 and report.parse_blocks(" All ") is None
    for text in ("0", "-3", "x", "1.5", ""):
        with pytest.raises(UsageError, match="positive number of blocks"):
            report.parse_blocks(text)
