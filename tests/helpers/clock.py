"""A training clock the test controls: time-budget runs then take the same steps on an idle and a busy machine."""

from __future__ import annotations

import math


class StepClock:
    """Every training step takes `step_seconds`: `StepMeter` reads each clock twice a step (when the step begins
    and when it ends), so the k-th reading is ceil(k / 2) steps in."""

    def __init__(self, step_seconds: float):
        self.step_seconds, self.readings = step_seconds, 0

    def __call__(self) -> float:
        now = math.ceil(self.readings / 2) * self.step_seconds
        self.readings += 1
        return now

