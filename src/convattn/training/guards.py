"""Training that stops at the first non-finite loss (training or eval), and never saves non-finite weights.

`FiniteTraining` is a `Trainer` mixin: every step's loss is checked (the Trainer already reads it on the host
each step to filter it for logging, so this adds no device sync), an evaluating subclass checks each eval loss
(`check_finite_eval`), and every save (checkpoints and the final model) first checks the weights. Each failure
is a `NonFiniteTraining` error, which the command line reports as one line: a run never ends "done" with NaN
weights. `TrainedSteps` counts the optimizer steps taken above learning rate 0, so that a run whose every step was
warmup at 0 is never reported as a result.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from convattn.errors import UsageError, listed


class NonFiniteTraining(UsageError):
    """The loss or the weights stopped being finite numbers."""


def non_finite_parameters(model: nn.Module) -> list[str]:
    """Names of the parameters holding a NaN or an infinity."""
    return [name for name, param in model.named_parameters() if not torch.isfinite(param.detach()).all()]


def check_finite_weights(model: nn.Module, what: str) -> None:
    """Raise `NonFiniteTraining` naming the first bad parameters of `model` (`what`: 'the model in DIR', ...)."""
    bad = non_finite_parameters(model)
    if bad:
        raise NonFiniteTraining(f"{what} has non-finite (NaN or infinite) weights: {listed(bad)}")


class FiniteTraining:
    """Mixin for `transformers.Trainer` (list it first among the bases). `divergence_hint` ends the error line:
    what to change, in the caller's words (e.g. 'lower --lr (now 1e+30)')."""

    divergence_hint = "lower the learning rate"
    # a non-finite loss before the first update comes from the starting weights or the data, never the lr
    first_step_hint = "check the starting model's weights (huge or damaged values) and the data"

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        value = float(loss)
        if not math.isfinite(value) and self.state.global_step == 0:
            raise NonFiniteTraining(f"training stopped at step 1: the loss is {value} before any update, so the "
                                    f"learning rate is not the cause; nothing was saved; {self.first_step_hint}")
        if not math.isfinite(value):
            raise NonFiniteTraining(f"training stopped at step {self.state.global_step + 1}: the loss is {value} (the "
                                    f"training diverged); nothing from this step on was saved; {self.divergence_hint}")
        return loss

    def check_finite_eval(self, loss: float) -> None:
        """Call with each evaluation's loss before it is logged: the Trainer evaluates before it saves, so a
        non-finite eval loss (weights finite but huge) stops the run before that step's checkpoint is written."""
        if not math.isfinite(loss):
            raise NonFiniteTraining(f"training stopped at step {self.state.global_step}: the eval loss is {loss} (the "
                                    f"weights no longer give finite losses); this step was not saved; "
                                    f"{self.divergence_hint}")

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        model = self.accelerator.unwrap_model(self.model)
        bad = non_finite_parameters(model)
        if bad:
            raise NonFiniteTraining(f"training stopped at step {self.state.global_step}: the weights are no longer "
                                    f"finite ({listed(bad)}); they were not saved; {self.divergence_hint}")
        super().save_model(output_dir, _internal_call)


class TrainedSteps(TrainerCallback, ExportableState):
    """How many optimizer steps ran at a learning rate above 0 (a warmup starts at 0), from the run's start:
    checkpoints record it, so a resumed run knows whether its model was ever trained (None: a run resumed from a
    checkpoint that does not say)."""

    def __init__(self, steps: int | None = 0):
        self.steps = steps

    def on_train_begin(self, args, state, control, **kwargs):
        # a state resumed from a checkpoint written before this callback was recorded has no entry to update
        state.stateful_callbacks.setdefault(type(self).__name__, self.state())

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if self.steps is not None and optimizer is not None and \
                any(group["lr"] > 0 for group in optimizer.param_groups):
            self.steps += 1

    def state(self) -> dict:
        return {"args": {"steps": self.steps}, "attributes": {}}
