"""The values every numeric training field allows, pretraining's (`Recipe`) and fine-tuning's (`FineTuneSettings`):
one table keyed by field name, and the checks that refuse a value outside it. A refusal names the field with
`option(field)`, which the command line says as the flag that sets it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from convattn.errors import UsageError, option

MAX_STEPS = 10**9  # years of training at any speed
MAX_EPOCHS = 10_000
MAX_SEED = 2**32 - 1  # numpy's limit (transformers' set_seed seeds numpy too)


@dataclass(frozen=True)
class Range:
    """Finite numbers between `low` and `high` (each bound allowed itself where closed)."""

    low: float
    high: float
    low_closed: bool = False
    high_closed: bool = False
    words: str | None = None  # the allowed values in words; None: "a finite number in <interval>"

    @property
    def interval(self) -> str:
        return f"{'[' if self.low_closed else '('}{self.low:g}, {self.high:g}{']' if self.high_closed else ')'}"

    @property
    def said(self) -> str:
        return self.words or f"a finite number in {self.interval}"

    def allows(self, value) -> bool:
        if not isinstance(value, int | float) or (isinstance(value, float) and not math.isfinite(value)):
            return False
        above = self.low <= value if self.low_closed else self.low < value
        below = value <= self.high if self.high_closed else value < self.high
        return above and below


COUNT = Range(1, math.inf, low_closed=True, words="an integer >= 1")

# field -> its range; fine-tuning's flags are checked in this order
RANGES = {
    "learning_rate": Range(0, math.inf, words="a finite number > 0"),
    "weight_decay": Range(0, math.inf, low_closed=True, words="a finite number >= 0"),
    "layer_decay": Range(0, 1, high_closed=True, words="a number in (0, 1] (1: no decay)"),
    "warmup_ratio": Range(0, 1, low_closed=True, words="a fraction in [0, 1)"),
    "epochs": Range(0, MAX_EPOCHS, high_closed=True, words=f"a number in (0, {MAX_EPOCHS:,}]"),
    "max_length": Range(1, math.inf, low_closed=True, words="an integer >= 1 (tokens per input)"),
    "max_steps": Range(1, MAX_STEPS, low_closed=True, high_closed=True, words=f"an integer from 1 to {MAX_STEPS:,}"),
    **dict.fromkeys(("batch_size", "max_train_samples", "doc_stride", "max_query_length", "n_best",
                     "max_answer_length"), COUNT),
    "adam_epsilon": Range(0, 1),
    "adam_beta1": Range(0, 1, low_closed=True),
    "adam_beta2": Range(0, 1, low_closed=True),
    "warmup": Range(0, math.inf, low_closed=True),  # steps, or a fraction of max_steps when below 1
    "max_grad_norm": Range(0, math.inf, low_closed=True),  # 0: no clipping
    "mlm_probability": Range(0, 1),
}


def check_range(field: str, value, name: str | None = None) -> None:
    """Refuse `value` (None: not given) outside the range of `field`; the message names `name`, else the field."""
    if value is not None and not RANGES[field].allows(value):
        raise UsageError(f"{name or option(field)} {value} must be {RANGES[field].said}")


def check_ranges(fields: Mapping[str, object]) -> None:
    """Each field of `fields` that has a range (None: not given) inside it, in the table's order."""
    for field in RANGES:
        if field in fields:
            check_range(field, fields[field])
