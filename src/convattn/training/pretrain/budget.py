"""Pretraining to a wall-clock budget, as academic-budget BERT (Izsak et al. 2021) and cramming (Geiping &
Goldstein 2022) do: the learning rate warms up linearly over a fraction of the budget, then decays linearly to
zero exactly at the deadline, whatever step that is; evaluations and checkpoints fall on a grid of the budget.

The clock counts training steps only: evaluation and checkpoint saving are measurements and do not spend the
budget, so rows of a comparison evaluated on different eval sets still train equally long. A checkpoint records
the time spent (in its trainer state, read back by runs.checkpoints), so a resumed run continues the same clock
and ends at the same total.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from convattn.errors import UsageError, option
from convattn.runs.checkpoints import saved_callback_state

EVALUATIONS = 10  # evaluations (each with a checkpoint) per budget, the last at the deadline
UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|min|m|s)")
MAX_BUDGET = 365 * UNITS["d"]  # a year: past it a budget is a typo, not a plan


def parse_duration(text: str) -> float:
    """Seconds in '90s', '30m', '2h', '1h30m' or a plain number of seconds."""
    cleaned = str(text).strip().lower()
    try:
        seconds = float(cleaned)
    except ValueError:
        parts = DURATION.findall(cleaned)
        if not parts or DURATION.sub("", cleaned).strip():
            raise UsageError(f"{option('time_budget')} {text!r}: give a duration such as 90s, 30m, 2h or 1h30m") \
                from None
        seconds = sum(float(number) * UNITS[unit] for number, unit in parts)
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"{option('time_budget')} {text!r} must be a positive duration, e.g. 30m")
    check_budget(seconds, text)
    return seconds


def check_budget(seconds: float, given: object) -> None:
    if seconds > MAX_BUDGET:
        raise UsageError(f"{option('time_budget')} {given} is more than {MAX_BUDGET // UNITS['d']} days; give a "
                         "duration up to 365d, e.g. 30m, 12h or 7d")


def format_duration(seconds: float) -> str:
    """30 min, 2 h, 1 h 30 min, 90 s."""
    if seconds < 120:
        return f"{seconds:g} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return " ".join(part for part in (f"{hours} h" if hours else "", f"{minutes} min" if minutes else "") if part)


def lr_factor(fraction: float, warmup: float) -> float:
    """The learning-rate multiplier at `fraction` of the budget: linear warmup over the first `warmup` of it,
    then linear decay to zero at the deadline."""
    if fraction < warmup:
        return fraction / warmup
    return max(0.0, (1.0 - fraction) / (1.0 - warmup))


class TrainingClock(TrainerCallback, ExportableState):
    """Time spent training (steps only), the stop at the deadline and the evaluations on the budget's grid. In a
    multi-process run rank 0's clock is every rank's, so all stop at the same step with the same learning rate.
    A step is timed by `timer` (seconds), which tests replace with a clock they control."""

    timer = staticmethod(time.perf_counter)

    def __init__(self, budget: float, spent: float = 0.0):
        self.budget = budget
        self.spent = spent
        self._step_started: float | None = None

    @property
    def fraction(self) -> float:
        return min(self.spent / self.budget, 1.0)

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_started = self.timer()

    def on_step_end(self, args, state, control, **kwargs):
        before = self.spent
        self.spent = _same_on_every_rank(self.spent + self.timer() - self._step_started)
        grid = self.budget / EVALUATIONS
        if math.floor(self.spent / grid) > math.floor(before / grid) or self.spent >= self.budget:
            control.should_evaluate = control.should_save = True
        if self.spent >= self.budget:
            control.should_training_stop = True
        return control

    def state(self) -> dict:
        return {"args": {"budget": self.budget}, "attributes": {"spent": self.spent}}


def _same_on_every_rank(value: float) -> float:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
        tensor = torch.tensor([value], dtype=torch.float64, device=device)
        torch.distributed.broadcast(tensor, src=0)
        return float(tensor.item())
    return value


def time_spent(checkpoint: Path) -> float:
    """The training time a checkpoint's run had spent (0 for a checkpoint without a clock)."""
    clock = saved_callback_state(checkpoint, TrainingClock.__name__)
    return float(clock["attributes"]["spent"]) if clock else 0.0


def budget_scheduler(optimizer: torch.optim.Optimizer, clock: TrainingClock, warmup: float):
    """A LambdaLR that reads the clock: the step count does not enter the schedule."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _step: lr_factor(clock.fraction, warmup))
