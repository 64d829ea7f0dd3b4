"""Pretraining to a time budget: the duration flag, the schedule's shape, the deadline, the clock across a resume."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from helpers.pretrain import TINY, write_corpus
from transformers import TrainerCallback

from convattn.cli import main
from convattn.errors import UsageError
from convattn.runs.pretrain import complete_checkpoints
from convattn.training.pretrain import pretrain
from convattn.training.pretrain.budget import format_duration, parse_duration, time_spent
from convattn.training.pretrain.options import check_numbers
from convattn.training.pretrain.resolve import resolve_options
from convattn.training.recipes import Recipe, resolve_recipe

pytestmark = pytest.mark.timing

# the tiny run without its step schedule: the budget sets it
BUDGET_TINY = [arg for i, arg in enumerate(TINY) if arg not in ("--max-steps", "--warmup")
               and TINY[i - 1] not in ("--max-steps", "--warmup")]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


class InterruptAfterSaves(TrainerCallback):
    """Ctrl-C once the run has saved `saves` checkpoints (on the budget's grid)."""

    def __init__(self, saves: int):
        self.saves, self.saved = saves, 0

    def on_save(self, args, state, control, **kwargs):
        self.saved += 1

    def on_step_end(self, args, state, control, **kwargs):
        if self.saved >= self.saves:
            raise KeyboardInterrupt


def budget_args(corpus: Path, out: Path, budget: str, *extra: str) -> list[str]:
    return ["pretrain", *BUDGET_TINY, "--train-file", str(corpus / "train.txt"), "--eval-file",
            str(corpus / "valid.txt"), "--output-dir", str(out), "--time-budget", budget, "--warmup", "0.2", *extra]


# steps of 1/8 s (the `step_clock` fixture) under a 4 s budget: an evaluation at step 0, then one each time the
# clock passes a tenth of the budget
GRID_STEPS = [0, 4, 7, 10, 13, 16, 20, 23, 26, 29, 32]


def last_checkpoint(out: Path) -> Path:
    return complete_checkpoints(out / "checkpoints")[-1]


def logged_learning_rates(out: Path) -> list[float]:
    state = json.loads((last_checkpoint(out) / "trainer_state.json").read_text())
    return [row["learning_rate"] for row in state["log_history"] if "learning_rate" in row]


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400),
                                               ("45", 45), ("0.5h", 1800), ("1d", 86400), ("40min", 2400),
                                               ("1h 30min", 5400)])
def test_durations_read_as_seconds(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("seconds", "text"), [(45, "45 s"), (90, "90 s"), (119, "119 s"), (120, "2 min"),
                                               (2400, "40 min"), (3600, "1 h"), (5400, "1 h 30 min"),
                                               (5399, "1 h 30 min"), (5369, "1 h 29 min")])  # to the nearest minute
def test_durations_are_said_in_seconds_below_two_minutes(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("text", ["", "abc", "30x", "0", "-5m", "inf", "nan", "30m garbage"])
def test_bad_durations_are_refused_naming_the_option(text):
    with pytest.raises(UsageError, match="time_budget"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["1e300", "366d", "9000h"])
def test_a_budget_past_a_year_is_refused_naming_the_option_and_the_maximum(text):
    with pytest.raises(UsageError, match=rf"`time_budget` {text} is more than 365 days; give a duration up to 365d"):
        parse_duration(text)
    with pytest.raises(UsageError, match="is more than 365 days"):  # given as a number, not through the parser
        check_numbers(dataclasses.replace(Recipe(preset="chang2021-small/composite"), time_budget=1e300, warmup=0.1))
    assert parse_duration("365d") == 365 * 86400


def test_a_budget_without_steps_keeps_the_recipes_warmup_share():
    recipe, note = resolve_recipe("chang2021-small/composite", training={"time_budget": 60.0})
    assert recipe.max_steps is None
    assert recipe.warmup == pytest.approx(10000 / 125000)
    assert "8.0%" in note
    capped, _ = resolve_recipe("chang2021-small/composite", training={"time_budget": 60.0, "max_steps": 50})
    assert capped.max_steps == 50


@pytest.mark.slow
def test_a_budget_run_ends_at_its_deadline_with_the_lr_at_zero(corpus, tmp_path, capsys, step_clock):
    out = tmp_path / "run"
    assert main(budget_args(corpus, out, "4s")) == 0
    printed = capsys.readouterr()
    assert "time budget     4 s of training (compute time), reached; 8 s of steps on the wall clock" in printed.out
    assert "linear decay to 0 at the deadline" in printed.err and "4 s of training compute time" in printed.err
    # the test's clocks: 32 steps of 1/8 s of compute fill the budget, and ten evaluations fall on its grid (every
    # 0.4 s); the wall clock, which the budget does not read, ran 1/4 s a step
    assert time_spent(last_checkpoint(out)) == {"compute": 4.0, "wall": 8.0}
    spent = 4.0
    rates = logged_learning_rates(out)
    peak = rates.index(max(rates))
    assert rates[0] == 0.0 and rates[:peak + 1] == sorted(rates[:peak + 1])  # warm-up, then only decay
    assert rates[peak:] == sorted(rates[peak:], reverse=True) and 0 < rates[-1] < rates[peak] / 10
    evaluations = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in evaluations] == GRID_STEPS
    assert evaluations[-1]["training_seconds"] == spent  # the clock, for compare's figure
    assert (evaluations[-1]["clock"], evaluations[-1]["training_wall_seconds"]) == ("compute", 8.0)
    assert evaluations[-1]["step_seconds"] == {"p10": 0.25, "median": 0.25, "p90": 0.25}
    assert (out / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_resumed_budget_run_continues_the_same_clock(corpus, tmp_path, capsys, step_clock):
    out = tmp_path / "run"
    options = resolve_options(
        output_dir=out, preset="chang2021-small/composite",
        model={"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64,
               "embedding_size": 16},
        training={"vocab_size": 150, "seq_len": 32, "batch_size": 8, "eval_samples": 24, "time_budget": 4.0,
                  "warmup": 0.2},
        data={"train_files": [str(corpus / "train.txt")], "eval_files": [str(corpus / "valid.txt")]},
    )
    assert pretrain(options, callbacks=[InterruptAfterSaves(6)]).interrupted
    # the sixth evaluation's checkpoint, at step 20: the budget's 4 s are past on the wall's clock, which this budget
    # does not read, and not on its own
    assert time_spent(last_checkpoint(out)) == {"compute": 2.5, "wall": 5.0}
    capsys.readouterr()
    # another clock would end the budget elsewhere: a schedule change, refused unless asked for
    resume = ["pretrain", "--output-dir", str(out), "--resume"]
    assert main([*resume, "--time-budget", "4s", "--budget-clock", "wall"]) == 2
    assert "--budget-clock: 'compute' -> 'wall'" in capsys.readouterr().err
    assert main(["pretrain", "--output-dir", str(out), "--resume"]) == 0
    printed = capsys.readouterr()
    assert "already spent" in printed.err
    assert time_spent(last_checkpoint(out)) == {"compute": 4.0, "wall": 8.0}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == GRID_STEPS  # the same run as one never stopped
    for clock in ("elapsed_seconds", "training_seconds"):  # both go on after the resume
        assert [row[clock] for row in rows] == sorted(row[clock] for row in rows)
    assert main(["pretrain", "--output-dir", str(out), "--resume"]) == 0  # finished: nothing to do
    assert "pretraining already finished: 32 steps" in capsys.readouterr().out  # its last checkpoint's


@pytest.mark.slow
def test_max_steps_ends_a_budget_run_first_when_it_comes_first(corpus, tmp_path, capsys, step_clock):
    out = tmp_path / "run"
    assert main(budget_args(corpus, out, "10m", "--max-steps", "3")) == 0
    printed = capsys.readouterr()
    assert "stops at step 3 if that comes first" in printed.err
    assert "pretraining done: 3 steps" in printed.out and "% spent" in printed.out


def test_a_warmup_in_steps_is_refused_under_a_budget(corpus, tmp_path, capsys):
    assert main(budget_args(corpus, tmp_path / "run", "1m", "--warmup", "100")) == 2
    assert "--warmup 100 is in steps" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit):
        main(budget_args(corpus, tmp_path / "run", "soon"))
    assert "--time-budget: 'soon': give a duration such as 90s, 30m, 2h or 1h30m" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_gives_every_row_the_same_budget_and_reports_what_it_bought(corpus, tmp_path, capsys, step_clock):
    out = tmp_path / "compare"
    args = ["compare", "--presets", "chang2021-small/absolute,chang2021-small/composite", "--seeds", "1",
            *BUDGET_TINY, "--train-file", str(corpus / "train.txt"), "--eval-file", str(corpus / "valid.txt"),
            "--output-dir", str(out), "--time-budget", "3s", "--warmup", "0.2"]
    args.remove("--preset")
    args.remove("chang2021-small/composite")
    assert main(args) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("run "))
    assert header.split()[:4] == ["run", "params", "tok/s", "steps"]
    report = (out / "report.md").read_text()
    assert "Steps reached" in report and "3 s of training compute time (CPU seconds per thread" in report
    assert "Step time (s): median [p10, p90]" in report and "| 0.25 [0.25, 0.25] | – |" in report
    assert "](perplexity_cost.png)" in report and (out / "perplexity_cost.png").is_file()
    runs = sorted((out / "runs").glob("*/seed0"))
    assert len(runs) == 2
    for run in runs:  # equal time on the test's clock: 24 steps of 1/8 s each
        assert time_spent(last_checkpoint(run))["compute"] == 3.0 and last_checkpoint(run).name == "checkpoint-24"
