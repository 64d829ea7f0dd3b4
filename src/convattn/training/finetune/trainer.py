"""Training one fine-tuning seed, whatever the task: its `TrainingArguments`, the quiet training loop (a progress
bar on screen, the Trainer's log dicts in log.txt), and the run.json that marks a finished seed."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import torch
from transformers import (
    DataCollatorWithPadding,
    PreTrainedTokenizerBase,
    ProgressCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from convattn.console import captured, say, world_size
from convattn.errors import UsageError, option
from convattn.files import read_json
from convattn.runs.finetune import SEED_RUN_FILE
from convattn.training.execution import (
    COMPILED_PAD_MULTIPLE,
    compile_arguments,
    precision_flags,
    settle_launcher,
    stays_on_cpu,
)
from convattn.training.finetune.settings import FineTuneSettings, changed_settings, same_settings
from convattn.training.guards import TrainedSteps

RUN_FILE = SEED_RUN_FILE  # written last: a seed folder without it is an interrupted seed


def finished_run(path: Path) -> dict | None:
    return read_json(path / RUN_FILE)


def check_finished_settings(path: Path, settings: FineTuneSettings) -> None:
    """A finished seed is reused only if it was made with these settings."""
    run = finished_run(path)
    if not (run and run["settings"]) or same_settings(run["settings"], settings):
        return
    changes = changed_settings(run["settings"], settings)
    shown = "; ".join(f"{option(name)} {old} there, {new} now" for name, old, new in changes[:3])
    more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
    name, old, _ = changes[0]
    raise UsageError(f"{path} was made with other settings ({shown}{more}); give {option(name)} {old} to add to its "
                     f"seeds, or another {option('output_dir')} ({option('overwrite')} replaces that run)")


def check_no_more_seeds(run_folder: Path, seeds: int) -> None:
    """The results average every finished seed of `run_folder` (`<output>/runs/<task>/seed<k>`): seeds past
    `seeds`, left by an earlier job, would be averaged in with settings never checked, so they are refused."""
    extra = sorted(int(path.name[4:]) for path in run_folder.glob("seed*")
                   if path.name[4:].isdigit() and int(path.name[4:]) >= seeds and (path / RUN_FILE).is_file())
    if extra:
        raise UsageError(f"{option('seeds')} {seeds}: {run_folder} also holds finished seed(s) "
                         f"{', '.join(map(str, extra))}, which the results would average in; give {option('seeds')} "
                         f"{extra[-1] + 1} or another {option('output_dir')}")


def fine_tuning_arguments(path: Path, settings: FineTuneSettings, seed: int, command: str) -> TrainingArguments:
    """The Trainer's arguments of one seed of `command` (glue, squad)."""
    flags = precision_flags(settings.precision)
    if note := settle_launcher(flags, processes=world_size()):  # before TrainingArguments reads the launcher's
        say(command, f"warning: {note}")
    return TrainingArguments(
        output_dir=str(path),
        learning_rate=settings.learning_rate,
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=128,
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps or -1,
        warmup_steps=settings.warmup_ratio,  # a float below 1 is a fraction of the total steps
        # no lr_scheduler_type: the schedule is ScheduledTrainer's (training/schedule.py), which does not read it
        weight_decay=settings.weight_decay,
        adam_epsilon=settings.adam_epsilon,
        seed=seed,
        save_strategy="no",
        eval_strategy="no",
        logging_steps=0.05,
        logging_first_step=True,
        report_to="none",
        dataloader_pin_memory=torch.cuda.is_available(),
        **compile_arguments(settings.compile, command),
        **flags,
        use_cpu=stays_on_cpu(flags["bf16"]),
    )


def padding_collator(collator_class: type[DataCollatorWithPadding], tokenizer: PreTrainedTokenizerBase,
                     settings: FineTuneSettings):
    """Batches padded to their longest example; under torch.compile, to the next multiple of COMPILED_PAD_MULTIPLE
    and at most settings.max_length: a few shapes to compile and record, not one per batch."""
    collator = collator_class(tokenizer)
    if not settings.compile:
        return collator

    def bucketed(features: list[dict]) -> dict:
        longest = max(len(feature["input_ids"]) for feature in features)
        width = min(-(-longest // COMPILED_PAD_MULTIPLE) * COMPILED_PAD_MULTIPLE, settings.max_length)
        return dataclasses.replace(collator, padding="max_length", max_length=max(width, longest))(features)

    return bucketed


def train_quietly(trainer: Trainer):
    """`trainer.train()` with the quiet progress bar; on any failure the bar is closed first, so the error line
    that follows stands on its own line. A run that took no step at a learning rate above 0 is refused: its model
    is the untrained one (`check_trains` refuses such settings before anything is written; this is the guard)."""
    trained = TrainedSteps()
    trainer.add_callback(trained)
    try:
        output = quiet_trainer(trainer).train()
    except BaseException:
        for callback in trainer.callback_handler.callbacks:
            if getattr(callback, "training_bar", None) is not None:
                callback.training_bar.close()
                callback.training_bar = None
        raise
    if trained.steps == 0:
        raise UsageError(f"fine-tuning took {output.global_step} step(s), none at a learning rate above 0 (all "
                         f"warmup): the model is untrained, so it is neither saved nor scored; give more "
                         f"{option('epochs')} or {option('max_steps')}")
    return output


def log_dict(state, logs: dict) -> None:
    """One log dict of the Trainer as a line of log.txt."""
    logging.getLogger("convattn.trainer").info(json.dumps({"step": state.global_step, **logs}))


class LoggedProgress(ProgressCallback):
    """The Trainer's progress bar with the latest loss as its postfix; each log dict goes to log.txt."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            log_dict(state, logs)
            if self.training_bar is not None and "loss" in logs:
                self.training_bar.set_postfix({"loss": f"{logs['loss']:.3f}"}, refresh=False)


class LogDicts(TrainerCallback):
    """--verbose: the Trainer prints its log dicts; they go to log.txt as well."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            log_dict(state, logs)


def quiet_trainer(trainer: Trainer) -> Trainer:
    """Swap the Trainer's dict-printing progress callback for `LoggedProgress`; with --verbose keep it and copy
    the dicts to log.txt."""
    if captured():
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(LoggedProgress())
    else:
        trainer.add_callback(LogDicts())
    return trainer
