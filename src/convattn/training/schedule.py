"""The learning-rate schedule of every training job, made in one place: a linear warmup to the optimizer's learning
rates, then a linear decay to zero at the end of the run. Pretraining and fine-tuning count it in optimizer steps;
pretraining to a time budget (pretrain/budget.py) counts it in the share of the budget spent, so that the decay
reaches zero at the deadline whatever step that is. Every job's Trainer asks `learning_rate_schedule` for it
(`ScheduledTrainer`). A warmup given as a fraction of the steps becomes whole steps before it gets here, by each
job's rule: pretraining's to the nearest step (`recipes.warmup_steps`), fine-tuning's up (TrainingArguments'
`get_warmup_steps`, which `check_trains` counts on).
"""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_linear_schedule_with_warmup


def lr_factor(fraction: float, warmup: float) -> float:
    """The learning-rate multiplier at `fraction` of a time budget: linear warmup over the first `warmup` of it,
    then linear decay to zero at the deadline."""
    if fraction < warmup:
        return fraction / warmup
    return max(0.0, (1.0 - fraction) / (1.0 - warmup))


def learning_rate_schedule(optimizer: Optimizer, warmup: float, steps: int | None = None, clock=None) -> LambdaLR:
    """The schedule of a run of `steps` optimizer steps that warms up over its first `warmup` steps (a whole
    number); or, given a time budget's `clock` (a pretrain.budget.TrainingClock: its `fraction` of the budget
    spent), of a run that warms up over the first `warmup` share of the budget, the step count not entering."""
    if clock is not None:
        return LambdaLR(optimizer, lambda _step: lr_factor(clock.fraction, warmup))
    return get_linear_schedule_with_warmup(optimizer, num_warmup_steps=int(warmup), num_training_steps=steps)


class ScheduledTrainer:
    """A Trainer mixin whose schedule is `learning_rate_schedule`'s: over the steps the Trainer runs, warming up over
    its arguments' warmup_steps (a fraction below 1 of the steps rounded up), or, where the Trainer has a `clock`,
    over that time budget, warming up over the `warmup` share of it."""

    clock = None
    warmup = 0.0

    def create_scheduler(self, num_training_steps: int, optimizer: Optimizer | None = None) -> LambdaLR:
        if self.lr_scheduler is None:
            optimizer = self.optimizer if optimizer is None else optimizer
            if self.clock is None:
                self.lr_scheduler = learning_rate_schedule(
                    optimizer, self.args.get_warmup_steps(num_training_steps), num_training_steps)
            else:
                self.lr_scheduler = learning_rate_schedule(optimizer, self.warmup, clock=self.clock)
            self._created_lr_scheduler = True  # a second train() makes it again, for its own optimizer
        return self.lr_scheduler
