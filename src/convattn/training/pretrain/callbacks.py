"""`Trainer` callbacks of a pretraining run: throughput, the steps that trained, metrics.jsonl + perplexity.png, the
progress bar."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from transformers import ProgressCallback, TrainerCallback
from transformers.trainer_callback import ExportableState

from convattn.files import save_figure, write_text_atomic
from convattn.runs.checkpoints import saved_callback_state
from convattn.runs.pretrain import METRICS_FILE, PLOT_FILE, read_metrics
from convattn.training.guards import TrainedSteps


class ThroughputMeter(TrainerCallback):
    """Tokens per second of training steps only (intervals containing an evaluation or save are left out)."""

    def __init__(self):
        self._last: tuple[float, int] | None = None
        self._skip_next = False
        self._seconds = 0.0
        self._tokens = 0

    def on_step_end(self, args, state, control, **kwargs):
        now, seen = time.perf_counter(), state.num_input_tokens_seen
        if self._last is not None and not self._skip_next:
            self._seconds += now - self._last[0]
            self._tokens += seen - self._last[1]
        self._last, self._skip_next = (now, seen), False

    def on_evaluate(self, args, state, control, **kwargs):
        self._skip_next = True

    def on_save(self, args, state, control, **kwargs):
        self._skip_next = True

    def rate(self) -> float:
        rate = self._tokens / self._seconds if self._seconds > 0 else 0.0
        self._seconds, self._tokens = 0.0, 0
        return round(rate, 1)


def steps_trained(checkpoint: Path) -> int | None:
    """The steps at a learning rate above 0 that `checkpoint`'s run had taken (`TrainedSteps`), or None for a
    checkpoint that does not say (written before it was recorded)."""
    try:
        steps = saved_callback_state(checkpoint, TrainedSteps.__name__)["args"]["steps"]
    except (KeyError, TypeError):
        return None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


class MetricsWriter(TrainerCallback, ExportableState):
    """metrics.jsonl (one row per evaluation) and perplexity.png, rewritten after each evaluation. With a `meter`
    (budget.StepMeter) a row also records the training time on both clocks and the spread of the steps since the
    last row; a time-budget run's meter (a `TrainingClock`) adds the budget's clock and its time.

    A row's elapsed_seconds is the run's wall time to it, evaluations and saves included: each checkpoint keeps the
    time at its save, and a resumed run goes on from it (the steps after the checkpoint, trained again, count
    once). Tests replace the clock (`wall`) with one they control."""

    wall = staticmethod(time.perf_counter)

    def __init__(self, output_dir: Path, meter=None):
        self.path = output_dir / METRICS_FILE
        self.plot_path = output_dir / PLOT_FILE
        self.rows = read_metrics(output_dir)
        self.meter = meter
        self._train: list[dict] = []
        self._started = self.wall()

    @property
    def elapsed(self) -> float:
        return self.wall() - self._started

    def keep_until(self, step: int, elapsed: float | None = None) -> None:
        """On resume from the checkpoint of `step`, saved `elapsed` seconds into the run: forget rows after it
        (they will be computed again); elapsed_seconds goes on from `elapsed`, or where the checkpoint does not say
        (saved before it was kept), from the last row kept."""
        self.rows = [row for row in self.rows if row["step"] <= step]
        if elapsed is None and self.rows:
            elapsed = self.rows[-1].get("elapsed_seconds")
        if elapsed is not None:
            self._started = self.wall() - elapsed
        self._write()

    def state(self) -> dict:
        return {"args": {}, "attributes": {"elapsed_seconds": self.elapsed}}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "loss" in logs:
            self._train.append(logs)
        if "eval_loss" in logs:
            recent = self._train
            row = {
                "step": state.global_step,
                "train_loss": round(sum(r["loss"] for r in recent) / len(recent), 5) if recent else None,
                "eval_loss": round(logs["eval_loss"], 5),
                "perplexity": round(logs["eval_perplexity"], 3),
                "tokens_per_second": recent[-1]["tokens_per_second"] if recent else None,
                "learning_rate": recent[-1].get("learning_rate") if recent else None,
                "tokens_seen": state.num_input_tokens_seen,
                "elapsed_seconds": round(self.elapsed, 1),
            }
            if getattr(self.meter, "budget", None) is not None:
                row |= {"training_seconds": round(self.meter.spent, 1), "clock": self.meter.clock}
            if self.meter is not None:
                row |= {"training_wall_seconds": round(self.meter.wall_spent, 1),
                        "training_compute_seconds": round(self.meter.compute_spent, 1) if self.meter.compute_known
                        else None, **self.meter.take_interval()}
            row |= {k.removeprefix("eval_"): round(v, 5) for k, v in logs.items()
                    if k.startswith("eval_") and k.removeprefix("eval_") in ("generator_loss", "discriminator_loss",
                                                                             "discriminator_accuracy")}
            self.rows = [r for r in self.rows if r["step"] != row["step"]] + [row]
            self._train = []
            self._write()

    def _write(self) -> None:
        write_text_atomic(self.path, "".join(json.dumps(row) + "\n" for row in self.rows))
        if self.rows:
            plot_perplexity(self.rows, self.plot_path)


def elapsed_at(checkpoint: Path) -> float | None:
    """The run's wall time when `checkpoint` was saved (`MetricsWriter.state`), or None for one that does not say."""
    attributes = saved_callback_state(checkpoint, MetricsWriter.__name__).get("attributes")
    seconds = attributes.get("elapsed_seconds") if isinstance(attributes, dict) else None
    number = isinstance(seconds, int | float) and not isinstance(seconds, bool)
    return float(seconds) if number and math.isfinite(seconds) and seconds >= 0 else None


def plot_perplexity(rows: Sequence[dict], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    ax.plot([r["step"] for r in rows], [r["perplexity"] for r in rows], marker="o", markersize=3)
    ax.set(xlabel="step", ylabel="eval perplexity", yscale="log", title="Eval perplexity (masked LM)")
    ax.grid(True, which="both", alpha=0.3)
    save_figure(fig, path, dpi=120)


BUDGET_BAR = "{l_bar}{bar}| {n_fmt}/{total_fmt} s of the budget [{elapsed}{postfix}]"


class PretrainProgress(ProgressCallback):
    """The Trainer's progress bar (steps, ETA; seconds of the budget for a time-budget run) with loss, tokens/s and
    eval perplexity as its postfix, and one line per evaluation."""

    def __init__(self, clock=None, label: str | None = None):
        super().__init__()
        self.label = f"{label}: " if label else ""
        self.postfix: dict[str, str] = {}
        self.clock = clock  # a `TrainingClock`: the bar counts its seconds, not steps

    def on_train_begin(self, args, state, control, **kwargs):
        if self.clock is None:
            return super().on_train_begin(args, state, control, **kwargs)
        if state.is_world_process_zero and self.training_bar is None:
            from tqdm.auto import tqdm

            self.training_bar = tqdm(total=round(self.clock.budget), initial=round(self.clock.spent),
                                     dynamic_ncols=True, bar_format=BUDGET_BAR)
        self.current_step = round(self.clock.spent)

    def on_step_end(self, args, state, control, **kwargs):
        if self.clock is None:
            return super().on_step_end(args, state, control, **kwargs)
        if state.is_world_process_zero and self.training_bar is not None:
            seconds = min(round(self.clock.spent), round(self.clock.budget))
            self.training_bar.update(seconds - self.current_step)
            self.current_step = seconds

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs:
            if "loss" in logs:
                self.postfix |= {"loss": f"{logs['loss']:.3f}", "tok/s": f"{logs['tokens_per_second']:.0f}"}
            if "eval_perplexity" in logs:
                self.postfix["eval_ppl"] = f"{logs['eval_perplexity']:.1f}"
                self.training_bar.write(f"{self.label}step {state.global_step:,}: eval perplexity "
                                        f"{logs['eval_perplexity']:,.1f}")
            self.training_bar.set_postfix(self.postfix, refresh=False)

    def close(self) -> None:
        """End the bar's line (a run stopped by an error: its message must start a line of its own)."""
        if self.training_bar is not None:
            self.training_bar.close()
            self.training_bar = None
