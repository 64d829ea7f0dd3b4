"""The settings every fine-tuning task shares, and how a task's recipe (`FineTuneRecipe`) resolves them: recipe
defaults < base-size settings < the task's own < overrides (the command line)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from convattn.console import world_size
from convattn.errors import UsageError, option
from convattn.training.execution import checked_compile_mode, resolved_precision
from convattn.training.ranges import check_range


@dataclass(frozen=True, kw_only=True)
class FineTuneSettings:
    """What the Trainer of any task needs; a task's settings class adds its own fields."""

    learning_rate: float
    batch_size: int
    epochs: float
    max_steps: int = 0             # > 0 overrides epochs
    warmup_ratio: float
    weight_decay: float
    layer_decay: float
    adam_epsilon: float
    max_length: int
    max_train_samples: int = 0     # 0 = the whole training set
    precision: str = "auto"        # execution.PRECISIONS; resolved for this machine by `resolved_settings`
    compile: str | None = None     # torch.compile's mode (execution.COMPILE_MODES; None: eager)


# settings that change how a seed runs, not what it computes: a finished seed is reused whatever they were
EXECUTION_ONLY = ("compile",)
# what seeds recorded before these settings existed ran with
UNRECORDED = {"precision": "fp32", "compile": None}


AnySettings = TypeVar("AnySettings", bound=FineTuneSettings)


def changed_settings(recorded: Mapping, settings: FineTuneSettings) -> list[tuple[str, object, object]]:
    """(field, recorded value, value now) of each setting whose change changes what a finished seed computed."""
    def computed(fields: Mapping) -> dict:
        return {name: value for name, value in fields.items() if name not in EXECUTION_ONLY}

    old, new = computed({**UNRECORDED, **recorded}), computed(dataclasses.asdict(settings))
    return [(name, old.get(name), new.get(name)) for name in sorted(old.keys() | new.keys())
            if old.get(name) != new.get(name)]


def same_settings(recorded: Mapping, settings: FineTuneSettings) -> bool:
    """Whether a finished seed's recorded settings compute what `settings` do."""
    return not changed_settings(recorded, settings)


def resolved_settings(settings: AnySettings) -> AnySettings:
    """The settings as this machine runs them: the precision resolved (auto: bf16 on a GPU that has it), the
    compile mode checked; the recipe's warmup checked too (a ratio of 1 or more would be read as steps)."""
    check_range("warmup_ratio", settings.warmup_ratio)
    checked_compile_mode(settings.compile)
    return dataclasses.replace(settings, precision=resolved_precision(settings.precision))


def given_overrides(overrides: Mapping | None) -> dict:
    """The settings fields the command line gave: a field set to None was not given (the recipe's value holds)."""
    return {name: value for name, value in (overrides or {}).items() if value is not None}


def check_one_process(command: str) -> None:
    """Fine-tuning runs in one process. Under a launcher's several processes each would check, train, score and
    write the same seeds in the same folder (each rank mending what the others were writing), and the Trainer would
    batch --batch-size per process: refused before anything is read or written."""
    processes = world_size()
    if processes > 1:
        raise UsageError(f"fine-tuning runs in one process, and this is one of {processes} that a launcher started "
                         f"(WORLD_SIZE={processes}): each would train and write the same seeds; run `convattn "
                         f"{command}` without torchrun or accelerate launch (a GPU a job: CUDA_VISIBLE_DEVICES=k, each "
                         f"job its own {option('output_dir')})")


def steps_per_epoch(examples: int, batch_size: int) -> int:
    """Optimizer steps in one pass over `examples` in batches of `batch_size` (one process, one device: see
    `check_one_process` and execution.check_one_gpu_per_process); the last batch may be partial; at least one, as
    the Trainer counts them."""
    return max(math.ceil(examples / batch_size), 1)


def optimizer_steps(settings: FineTuneSettings, examples: int) -> int:
    """The optimizer steps a run takes, as the Trainer counts them: `max_steps`, else the epochs' share of the
    steps per epoch, rounded up."""
    if settings.max_steps:
        return settings.max_steps
    return math.ceil(settings.epochs * steps_per_epoch(examples, settings.batch_size))


def least_steps_that_train(warmup_ratio: float) -> int:
    """The fewest steps with one at a learning rate above 0: the linear warmup over ceil(steps x ratio) steps
    starts at 0, so a warmup needs a second step (which runs above 0 whatever the ratio)."""
    return 2 if warmup_ratio > 0 else 1


def check_trains(settings: FineTuneSettings, examples: int, what: str, unit: str = "examples") -> None:
    """Refuse, before anything is written, a run whose every step would run at learning rate 0 (or that has no
    step at all): its model would be the untrained one, reported as a result. `what`: the training set in words
    ('sst2', 'SQuAD v1.1'); `unit`: what it counts (examples, windows)."""
    steps, least = optimizer_steps(settings, examples), least_steps_that_train(settings.warmup_ratio)
    if examples > 0 and steps >= least:
        return
    if examples == 0:
        raise UsageError(f"the {what} training set is empty: there is nothing to fine-tune on")
    warmup = (f"which the warmup ({option('warmup_ratio')} {settings.warmup_ratio:g}, rounded up to whole steps) "
              "runs at learning rate 0")
    if settings.max_steps:
        raise UsageError(f"{option('max_steps')} {settings.max_steps} trains nothing: {counted(steps)}, {warmup}; give "
                         f"{option('max_steps')} {least} or more, or {option('warmup_ratio')} 0")
    per_epoch = steps_per_epoch(examples, settings.batch_size)
    raise UsageError(f"{option('epochs')} {settings.epochs:g} trains nothing on {what}: {examples:,} training "
                     f"{unit} in batches of {settings.batch_size:,} make {counted(per_epoch)} an "
                     f"epoch, so {settings.epochs:g} epochs is {counted(steps)}, {warmup}; give {option('epochs')} "
                     f"{least_epochs(least, per_epoch)} or more")


def counted(steps: int) -> str:
    return f"{steps:,} step{'' if steps == 1 else 's'}"


def least_epochs(steps: int, per_epoch: int) -> str:
    """The least epochs (to 3 significant digits, rounded up) that make `steps` steps of `per_epoch` an epoch,
    as the Trainer rounds them (up)."""
    exact = (steps - 1) / per_epoch  # any epochs above this round up to `steps`
    digits = 3 - 1 - math.floor(math.log10(exact)) if exact > 0 else 3
    value = math.floor(exact * 10**digits + 1) / 10**digits
    while math.ceil(value * per_epoch) < steps:  # floating point: step up until the Trainer's rounding agrees
        value += 10**-digits
    return f"{value:.{max(digits, 0)}f}".rstrip("0").rstrip(".")
