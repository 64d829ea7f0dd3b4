"""Tokens per second, as metrics.jsonl and the comparison report give them, on a clock the test controls: the
tokens between two step ends over the time between them, no interval that holds an evaluation or a save, and each
reading covers the steps since the one before."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from convattn.training.pretrain import callbacks
from convattn.training.pretrain.callbacks import ThroughputMeter


class Steps:
    """Drives a meter as the Trainer does: step ends at given times with given tokens seen so far."""

    def __init__(self, meter: ThroughputMeter, monkeypatch):
        self.meter, self.now, self.state = meter, 0.0, SimpleNamespace(num_input_tokens_seen=0)
        monkeypatch.setattr(callbacks.time, "perf_counter", lambda: self.now)

    def step(self, seconds: float, tokens: int) -> None:
        self.now += seconds
        self.state.num_input_tokens_seen += tokens
        self.meter.on_step_end(None, self.state, None)


def test_rate_is_tokens_over_training_time_between_readings(monkeypatch):
    meter = ThroughputMeter()
    steps = Steps(meter, monkeypatch)
    steps.step(5.0, 1000)  # the first step's interval starts before the meter's first reading: not counted
    steps.step(2.0, 800)
    steps.step(3.0, 1200)
    assert meter.rate() == pytest.approx(2000 / 5.0)
    steps.step(1.0, 300)  # a reading covers only what came after the one before
    assert meter.rate() == pytest.approx(300.0)
    assert meter.rate() == 0.0  # nothing since


@pytest.mark.parametrize("event", ["on_evaluate", "on_save"])
def test_an_interval_holding_an_evaluation_or_a_save_is_left_out(monkeypatch, event):
    meter = ThroughputMeter()
    steps = Steps(meter, monkeypatch)
    steps.step(1.0, 0)
    steps.step(2.0, 500)
    getattr(meter, event)(None, steps.state, None)
    steps.step(60.0, 400)  # the step plus the evaluation or save after the one before
    steps.step(2.0, 700)
    assert meter.rate() == pytest.approx((500 + 700) / 4.0)


def test_a_reading_is_rounded_to_a_tenth_of_a_token_per_second(monkeypatch):
    meter = ThroughputMeter()
    steps = Steps(meter, monkeypatch)
    steps.step(1.0, 0)
    steps.step(3.0, 1000)
    assert meter.rate() == 333.3
