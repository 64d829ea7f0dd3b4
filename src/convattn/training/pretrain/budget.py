"""Pretraining to a time budget, as academic-budget BERT (Izsak et al. 2021) and cramming (Geiping & Goldstein
2022) do: the learning rate warms up linearly over a fraction of the budget, then decays linearly to zero exactly
at the deadline, whatever step that is (training/schedule.py makes that schedule from this clock); evaluations
and checkpoints fall on a grid of the budget.

The clock counts training steps only: evaluation and checkpoint saving are measurements and do not spend the
budget, so rows of a comparison evaluated on different eval sets still train equally long. By default it counts
compute, not the wall's time: on CPU the process's CPU seconds per thread, which other processes on the machine do
not move (beside two busy processes, a wall-clock budget bought a fifth of the steps it bought alone); on a GPU the
GPU's own clock. The wall clock is one option away (`CLOCKS`). A checkpoint records the time spent on both clocks
(in its trainer state, read back by runs.checkpoints), so a resumed run continues the same clock and ends at the
same total.
"""

from __future__ import annotations

import math
import os
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


CLOCKS = ("compute", "wall")
DEFAULT_CLOCK = "compute"  # what other processes cannot move; runs recorded before the choice existed used "wall"
# a step counts as slowed by outside load when its threads spent more than this share of their time runnable but
# waiting for a CPU (Linux's schedstat): 0 on an idle machine, about half beside two busy processes on 2 cores
SLOWED_SHARE = 0.1


CLOCK_WORDS = {"compute": "compute time", "wall": "wall-clock time"}
CLOCK_EXPLAINED = {"compute": "CPU seconds per thread, or the GPU's own time, which other processes do not move",
                   "wall": "which other processes on the machine can slow down"}


def compute_seconds() -> float:
    """The CPU seconds this process has used, per intra-op thread: about the wall time of a step that keeps its
    threads busy on an idle machine, and unmoved by other processes, which only make the step wait. Waiting threads
    must sleep rather than spin for this to hold under load (the command line sets OMP_WAIT_POLICY=PASSIVE before
    torch loads where a compute clock counts: `convattn.openmp`)."""
    return time.process_time() / torch.get_num_threads()


def waiting_seconds(tasks_dir: str = "/proc/self/task") -> float | None:
    """Seconds this process's threads have spent runnable but waiting for a CPU (the second of the three fields of
    /proc/self/task/*/schedstat, in ns; the first is time on a CPU), or None where the system does not say."""
    try:
        tasks = os.listdir(tasks_dir)
    except OSError:
        return None
    total, read = 0, False
    for task in tasks:
        try:  # os.read rather than open(), a quarter of its cost: this runs twice a step
            descriptor = os.open(f"{tasks_dir}/{task}/schedstat", os.O_RDONLY)
            try:
                total += int(os.read(descriptor, 128).split()[1])
            finally:
                os.close(descriptor)
            read = True
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile, or no schedstat
            continue
    return total / 1e9 if read else None


class DeviceSeconds:
    """A GPU's own clock (CUDA events), in seconds since the first reading; each reading waits for the work queued
    before it, so a step's time on it is the GPU's time for that step (which another process on the same GPU, or a
    host the GPU waits for, still lengthens: only a profiler separates those)."""

    def __init__(self):
        self.first = None

    def __call__(self) -> float:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        event.synchronize()
        if self.first is None:
            self.first = event
        return self.first.elapsed_time(event) / 1000


class StepMeter(TrainerCallback, ExportableState):
    """The time of each training step on two clocks, the wall's and compute's (`compute_seconds` on CPU, the GPU's
    own clock on a GPU), their totals, and per interval (`take_interval`, at each evaluation) the spread of the
    steps' wall times and the share of steps that other processes slowed (`SLOWED_SHARE`). Evaluation and saving
    fall between steps and are not counted. Tests replace the clocks (`wall`, `compute`) with ones they control."""

    wall = staticmethod(time.perf_counter)
    compute = staticmethod(compute_seconds)
    waiting = staticmethod(waiting_seconds)

    def __init__(self, wall_spent: float = 0.0, compute_spent: float = 0.0):
        self.wall_spent, self.compute_spent = wall_spent, compute_spent
        self._compute = type(self).compute
        self._started: tuple | None = None
        self._walls: list[float] = []
        self._slowed: list[bool] = []
        self.steps_slowed = self.steps_seen = 0  # this process's steps: slowed by outside load, and told about

    reads_compute = False  # whether a budget reads the compute clock

    def on_train_begin(self, args, state, control, **kwargs):
        if args.device.type == "cuda" and type(self).compute is compute_seconds:
            # the GPU's clock waits for each step's work: only a budget that reads it pays for that; otherwise the
            # compute total is not kept (CPU seconds say nothing of a GPU's work)
            self._compute = DeviceSeconds() if self.reads_compute else None

    @property
    def compute_known(self) -> bool:
        return self._compute is not None

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = (self.wall(), self._compute() if self._compute else 0.0, self.waiting())

    def on_step_end(self, args, state, control, **kwargs):
        wall0, compute0, waiting0 = self._started
        wall, waiting = self.wall() - wall0, self.waiting()
        self.wall_spent += wall
        if self._compute is not None:
            self.compute_spent += self._compute() - compute0
        self._walls.append(wall)
        if waiting is not None and waiting0 is not None:
            slowed = waiting - waiting0 > SLOWED_SHARE * wall * torch.get_num_threads()
            self._slowed.append(slowed)
            self.steps_slowed += slowed
            self.steps_seen += 1

    def take_interval(self) -> dict:
        """The steps since the last call: their wall times' 10th, 50th and 90th percentiles and the share of them
        slowed by other processes (None where the system does not say)."""
        walls, slowed = sorted(self._walls), self._slowed
        self._walls, self._slowed = [], []
        if not walls:
            return {}
        spread = {name: round(walls[min(len(walls) - 1, int(q * len(walls)))], 4)
                  for name, q in (("p10", 0.1), ("median", 0.5), ("p90", 0.9))}
        return {"step_seconds": spread,
                "slowed_steps": round(sum(slowed) / len(slowed), 3) if slowed and len(slowed) == len(walls) else None}

    def state(self) -> dict:
        return {"args": {}, "attributes": {"wall_spent": self.wall_spent, "compute_spent": self.compute_spent}}


class TrainingClock(StepMeter):
    """Time spent training (steps only) on the budget's clock (`CLOCKS`: compute by default, or the wall's), the
    stop at the deadline and the evaluations on the budget's grid. Both clocks' totals are kept, whichever the
    budget reads. In a multi-process run rank 0's clock is every rank's, so all stop at the same step with the same
    learning rate."""

    def __init__(self, budget: float, clock: str = DEFAULT_CLOCK, spent: dict | None = None):
        spent = spent or {}
        super().__init__(spent.get("wall", 0.0), spent.get("compute", 0.0))
        self.budget, self.clock = budget, clock
        self.spent = spent.get(clock, 0.0)

    @property
    def reads_compute(self) -> bool:
        return self.clock == "compute"

    @property
    def fraction(self) -> float:
        return min(self.spent / self.budget, 1.0)

    def on_step_end(self, args, state, control, **kwargs):
        super().on_step_end(args, state, control, **kwargs)
        before = self.spent
        self.spent = _same_on_every_rank(self.compute_spent if self.clock == "compute" else self.wall_spent)
        grid = self.budget / EVALUATIONS
        if math.floor(self.spent / grid) > math.floor(before / grid) or self.spent >= self.budget:
            control.should_evaluate = control.should_save = True
        if self.spent >= self.budget:
            control.should_training_stop = True
        return control

    def state(self) -> dict:
        return {"args": {"budget": self.budget, "clock": self.clock},
                "attributes": {"spent": self.spent, "wall_spent": self.wall_spent,
                               "compute_spent": self.compute_spent}}


def _same_on_every_rank(value: float) -> float:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
        tensor = torch.tensor([value], dtype=torch.float64, device=device)
        torch.distributed.broadcast(tensor, src=0)
        return float(tensor.item())
    return value


def time_spent(checkpoint: Path) -> dict:
    """The training time a checkpoint's run had spent on each clock ({"wall": s, "compute": s}; {} for a checkpoint
    without a clock or a meter). A checkpoint written before both were kept holds one total, on the wall's clock,
    which then stands for both (the compute clock goes on from it)."""
    clock = (saved_callback_state(checkpoint, TrainingClock.__name__) or
             saved_callback_state(checkpoint, StepMeter.__name__))
    if not clock:
        return {}
    saved = clock["attributes"]
    if "wall_spent" not in saved:
        return {"wall": float(saved["spent"]), "compute": float(saved["spent"])}
    return {"wall": float(saved["wall_spent"]), "compute": float(saved["compute_spent"])}
