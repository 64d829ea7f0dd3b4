"""The time budget's clocks: compute (the default) or wall, both totals kept, the steps that other processes slowed,
and the runs and checkpoints recorded before the choice existed (they counted the wall's time)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch
from helpers.clock import StepClock

from convattn.runs.pretrain import recorded_options
from convattn.training.compare.grids import RunSpec
from convattn.training.compare.report import slowed, step_spread
from convattn.training.compare.results import RunResult
from convattn.training.pretrain.budget import (
    SLOWED_SHARE,
    StepMeter,
    TrainingClock,
    compute_seconds,
    time_spent,
    waiting_seconds,
)

ARGS = SimpleNamespace(device=torch.device("cpu"))


def run_steps(meter: StepMeter, steps: int) -> int:
    """Steps the meter times until its control says stop (at most `steps`); returns how many ran."""
    meter.on_train_begin(ARGS, None, None)
    for step in range(1, steps + 1):
        control = SimpleNamespace(should_evaluate=False, should_save=False, should_training_stop=False)
        meter.on_step_begin(ARGS, None, control)
        meter.on_step_end(ARGS, None, control)
        if control.should_training_stop:
            return step
    return steps


@pytest.fixture
def clocks(monkeypatch):
    """Steps of 1/8 s of compute and 1/4 s on the wall; `waiting` (seconds waited for a CPU) is the test's."""
    waited = {"seconds": 0.0}
    monkeypatch.setattr(StepMeter, "compute", staticmethod(StepClock(0.125)))
    monkeypatch.setattr(StepMeter, "wall", staticmethod(StepClock(0.25)))
    monkeypatch.setattr(StepMeter, "waiting", staticmethod(lambda: waited["seconds"]))
    return waited


@pytest.mark.parametrize(("clock", "steps"), [("compute", 32), ("wall", 16)])
def test_the_budget_reads_its_own_clock_and_keeps_both_totals(clocks, clock, steps):
    meter = TrainingClock(4.0, clock)
    assert run_steps(meter, 100) == steps
    assert meter.spent == 4.0 and meter.fraction == 1.0
    assert (meter.compute_spent, meter.wall_spent) == (steps * 0.125, steps * 0.25)
    assert meter.state()["args"] == {"budget": 4.0, "clock": clock}


def test_a_resumed_clock_goes_on_from_the_checkpoints_totals(clocks):
    meter = TrainingClock(4.0, "wall", {"wall": 3.0, "compute": 1.0})
    assert meter.spent == 3.0
    assert run_steps(meter, 100) == 4  # 1 s of wall time left, 1/4 s a step
    assert (meter.wall_spent, meter.compute_spent) == (4.0, 1.5)


def test_the_interval_spread_and_the_steps_slowed_by_other_processes(clocks, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    meter = StepMeter()
    meter.on_train_begin(ARGS, None, None)
    for step in range(10):
        meter.on_step_begin(ARGS, None, None)
        # threads waited for a CPU in 3 of 10 steps: 0.06 s of 2 threads x 0.25 s is above the share, 0.04 s not
        clocks["seconds"] += 0.06 if step in (2, 5, 8) else 0.04
        meter.on_step_end(ARGS, None, None)
    assert 0.04 < SLOWED_SHARE * 0.25 * 2 < 0.06
    assert meter.take_interval() == {"step_seconds": {"p10": 0.25, "median": 0.25, "p90": 0.25}, "slowed_steps": 0.3}
    assert (meter.steps_slowed, meter.steps_seen) == (3, 10)
    assert meter.take_interval() == {}  # the next interval starts empty


def test_the_spread_is_each_percentile_of_the_intervals_steps(clocks, monkeypatch):
    steps = [7, 3, 20, 1, 15, 9, 12, 2, 18, 5, 11, 4, 16, 8, 19, 6, 13, 10, 17, 14]
    readings = iter([reading for seconds in steps for reading in (100.0, 100.0 + seconds)])  # a step's begin, end
    monkeypatch.setattr(StepMeter, "wall", staticmethod(lambda: next(readings)))
    meter = StepMeter()
    run_steps(meter, len(steps))
    # of 20 sorted steps: the 3rd (p10), the 11th (median) and the 19th (p90), not the slowest
    assert meter.take_interval()["step_seconds"] == {"p10": 3.0, "median": 11.0, "p90": 19.0}
    # of 3, the middle one is the median (the index is truncated, not rounded: round(1.5) would take the slowest)
    readings = iter([reading for seconds in (1, 3, 2) for reading in (100.0, 100.0 + seconds)])
    run_steps(meter, 3)
    assert meter.take_interval()["step_seconds"] == {"p10": 1.0, "median": 2.0, "p90": 3.0}


def test_waiting_is_the_second_schedstat_field_summed_over_threads(tmp_path):
    for task, line in (("101", "900000000 2500000000 40\n"), ("102", "7000000000 500000000 12\n")):
        (tmp_path / task).mkdir()
        (tmp_path / task / "schedstat").write_text(line)  # ns on a CPU, ns waiting for one, timeslices
    (tmp_path / "103").mkdir()  # a thread that ended between the listing and the read
    assert waiting_seconds(str(tmp_path)) == pytest.approx(3.0)
    assert waiting_seconds(str(tmp_path / "absent")) is None
    # threads listed but none of them readable: the system did not say (unknown), not zero seconds waited
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "104").mkdir()
    assert waiting_seconds(str(tmp_path / "none")) is None


def test_a_system_that_does_not_say_leaves_the_slowed_share_unknown(clocks, monkeypatch):
    monkeypatch.setattr(StepMeter, "waiting", staticmethod(lambda: None))
    meter = StepMeter()
    run_steps(meter, 3)
    assert meter.take_interval()["slowed_steps"] is None and meter.steps_seen == 0


def test_a_share_of_only_some_steps_is_not_given_for_the_interval(clocks, monkeypatch):
    readings = iter([0.0, 0.0, None, None, 0.0, 1.0])  # a step's begin and end: known, unknown, known (slowed)
    monkeypatch.setattr(StepMeter, "waiting", staticmethod(lambda: next(readings)))
    meter = StepMeter()
    run_steps(meter, 3)
    assert (meter.steps_slowed, meter.steps_seen) == (1, 2)
    assert meter.take_interval()["slowed_steps"] is None  # 1 of 2 known steps would stand for all 3


def test_compute_is_cpu_seconds_per_thread(monkeypatch):
    monkeypatch.setattr(time, "process_time", lambda: 12.0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert compute_seconds() == 3.0


def checkpoint_with(tmp_path, callback: str, attributes: dict):
    checkpoint = tmp_path / "checkpoint-8"
    checkpoint.mkdir()
    state = {"stateful_callbacks": {callback: {"args": {}, "attributes": attributes}}}
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    return checkpoint


def test_a_checkpoint_from_before_both_clocks_read_its_one_total_as_both(tmp_path):
    assert time_spent(checkpoint_with(tmp_path, "TrainingClock", {"spent": 7.5})) == {"wall": 7.5, "compute": 7.5}


def test_a_step_runs_checkpoint_keeps_its_meters_totals(tmp_path):
    checkpoint = checkpoint_with(tmp_path, "StepMeter", {"wall_spent": 9.0, "compute_spent": 6.0})
    assert time_spent(checkpoint) == {"wall": 9.0, "compute": 6.0}
    assert time_spent(tmp_path) == {}  # no trainer state: nothing spent


def test_options_recorded_before_the_choice_counted_the_wall_clock(tmp_path):
    budget, steps = tmp_path / "budget.json", tmp_path / "steps.json"
    budget.write_text(json.dumps({"time_budget": 60.0, "max_steps": None}))
    steps.write_text(json.dumps({"time_budget": None, "max_steps": 500}))
    assert recorded_options(budget)["budget_clock"] == "wall"
    assert recorded_options(steps)["budget_clock"] == "compute"  # no budget: the clock changes nothing


def test_the_report_marks_a_run_that_other_processes_slowed():
    rows = {0: [{"step": 10, "step_seconds": {"p10": 0.2, "median": 0.25, "p90": 0.3}, "slowed_steps": 0.0}],
            1: [{"step": 10, "step_seconds": {"p10": 0.1, "median": 0.35, "p90": 0.9}, "slowed_steps": 0.5}]}
    result = RunResult(RunSpec("absolute", "chang2021-small/absolute"), rows, [0, 1], None, {})
    assert result.step_seconds == {"p10": 0.1, "median": 0.3, "p90": 0.9}
    assert result.slowed_steps == 0.25
    assert step_spread(result.step_seconds) == "0.3 [0.1, 0.9]"
    assert slowed(result.slowed_steps) == "25% (slowed)" and slowed(0.05) == "5%" and slowed(None) == "–"
    old = RunResult(RunSpec("absolute", "chang2021-small/absolute"), {0: [{"step": 10}]}, [0], None, {})
    assert old.step_seconds is None and old.slowed_steps is None


def test_a_run_mostly_slowed_by_other_processes_is_told_how_threads_can_wait(monkeypatch, tmp_path):
    from convattn.training.pretrain.job import PretrainSummary

    def summary(slowed):
        return "\n".join(PretrainSummary(tmp_path, 10, 100, 5, 90.0, 80.0, 60.0, "corpus", slowed=slowed).lines())

    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):  # an in-process command line may have set either
        monkeypatch.delenv(name, raising=False)
    assert "OMP_WAIT_POLICY=PASSIVE trains faster" in summary(0.8)
    assert "OMP_WAIT_POLICY" not in summary(0.2)  # a few slowed steps: the spin costs little
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert "OMP_WAIT_POLICY" not in summary(0.8)  # already sleeping
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")  # a spin count overrides the policy: the threads spin
    assert "OMP_WAIT_POLICY=PASSIVE trains faster" in summary(0.8)
