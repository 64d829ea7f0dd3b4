"""The fine-tuning protocol, written once for every task: `run_job` owns the order of checks that
docs/reliability.md promises; a task's `FineTuneJob` (glue/job.py, squad/job.py) supplies its data, settings and
scoring.

Every check comes before the first write, each refusing before the next is reached: one process on at most one GPU
(fine-tuning runs no other way); the task's inputs (flags, recipe, data files), the output folder, the model and the
settings that fit it; then, holding the folder: what a killed run left, links where the job writes and --overwrite's
checks; the finished seeds (made with these settings, none past --seeds); the task's own checks of the folder; the
files the seeds to train would remove (the job's only); the task's data (read, and enough to train). The first write
is the model record (another model's finished seeds are refused there). Then each task: its finished seeds reused
and said, the others trained (a seed that fails leaves nothing; the run --overwrite replaces goes once the first
seed stands); last the results over every finished seed, and each task's best seed's model published.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from convattn.console import log_to, processes, say, say_launch
from convattn.runs.finetune import check_restartable, foreign_files, reused_seeds
from convattn.runs.folder import check_output_folder, run_folder_lock, seed_dir
from convattn.runs.replace import JobLayout, drop_replaced_if_standing, recover_replaced_run, replaces, replacing
from convattn.training.execution import check_one_gpu_per_process
from convattn.training.finetune.failures import new_job, seed_attempt
from convattn.training.finetune.models import check_save_models, publish_best
from convattn.training.finetune.pretrained import PretrainedModel, check_same_model, load_pretrained
from convattn.training.finetune.settings import FineTuneSettings, check_one_process
from convattn.training.finetune.trainer import check_finished_settings, check_no_more_seeds, finished_run

# (task name, best seed, its seeds) -> models/<name>/, or None when there is no model to publish
Publish = Callable[[str, int, list[int]], Path | None]


@dataclass(frozen=True)
class Task:
    """One task of a job: its seeds are runs/<name>/seed<k>/ (a GLUE task, a SQuAD version)."""

    name: str
    label: str                   # how its lines name it: sst2, v1.1
    settings: FineTuneSettings
    trains: bool = True          # False: only predicted, with a model another task trained (GLUE's AX)


@dataclass(kw_only=True)
class FineTuneJob:
    """A job's request, and the task's pieces `run_job` calls (a subclass per task)."""

    model: str
    output_dir: Path
    seeds: int | None = None     # None: the recipe's (`check_inputs` sets it)
    save_models: str = "best"
    overwrite: bool = False      # replace the job the folder holds, kept aside until the new one's first seed

    layout: ClassVar[JobLayout]  # the command (glue, squad), its model record, what --overwrite moves aside
    foreign_use: ClassVar[str]   # what is done with a model that is not convattn's, said when one is given
    keeps_seed_models: ClassVar[frozenset[str]] = frozenset()  # tasks whose seeds' models others start from

    def check_inputs(self) -> None:
        """Flags, recipe and data files: everything checked before the output folder."""
        raise NotImplementedError

    def fitted_tasks(self, pretrained: PretrainedModel) -> list[Task]:
        """The tasks in the order they run, with settings that fit the model (a flag given that does not fit is
        refused)."""
        raise NotImplementedError

    def check_folder(self, replace: bool) -> None:
        """The task's own checks of the output folder, after its finished seeds'."""

    def read_data(self, names: list[str]) -> None:
        """Read and check the data of the tasks named (those with seeds to train), and that each trains: the last
        check before the first write."""
        raise NotImplementedError

    def prepare(self, task: Task) -> Any:
        """The data a task's seeds train on (once the job writes, before its seeds)."""
        raise NotImplementedError

    def train_seed(self, task: Task, seed: int, data: Any, path: Path, identity: str) -> list[str]:
        """Train and score one seed into `path` (`identity`: the model's fingerprint when the job started);
        returns the lines to say of it (its scores)."""
        raise NotImplementedError

    def aggregate(self, publish: Publish) -> dict:
        """Every finished seed of the output folder -> the results (written); each task's best seed handed to
        `publish`."""
        raise NotImplementedError


def run_job(job: FineTuneJob) -> dict:
    """Check everything, fine-tune each task's seeds not finished in the output folder, then aggregate it."""
    out, command = job.output_dir, job.layout.job
    check_one_process(command)
    check_one_gpu_per_process(command)
    check_save_models(job.save_models)
    job.check_inputs()
    check_output_folder(out)
    tasks = job.fitted_tasks(load_pretrained(job.model, command, job.foreign_use))
    with run_folder_lock(out):  # a refusal before the first write leaves nothing behind
        recover_replaced_run(out, job.layout)
        replace = replaces(out, job.layout, lambda folder: foreign_files(folder, command), job.overwrite)
        if not replace:  # the seeds of the job replaced are neither reused nor checked
            for task in tasks:
                check_finished_seeds(out, task, job.seeds)
        job.check_folder(replace)
        pending = {task.name: [seed for seed in range(job.seeds)
                               if replace or finished_run(seed_dir(out, task.name, seed)) is None] for task in tasks}
        check_restartable(out, command, [seed_dir(out, name, s) for name, seeds in pending.items() for s in seeds])
        job.read_data([name for name, seeds in pending.items() if seeds])
        with replacing(out, job.layout, replace), new_job(out, job.layout):
            identity = check_same_model(out, job.model, job.layout.record)  # the first write
            log_to(out)
            say_launch(command)
            for task in tasks:
                train_seeds(job, task, pending[task.name], identity)
            return job.aggregate(partial(publish, job))


def check_finished_seeds(out: Path, task: Task, seeds: int) -> None:
    """A task's finished seeds are reused only if made with these settings, and none past `seeds` (the results
    would average it in)."""
    for seed in range(seeds):
        check_finished_settings(seed_dir(out, task.name, seed), task.settings)
    check_no_more_seeds(seed_dir(out, task.name), seeds)


def train_seeds(job: FineTuneJob, task: Task, pending: list[int], identity: str) -> None:
    """The `pending` seeds of one task, the others (finished) reused as they are, and said."""
    out, command = job.output_dir, job.layout.job
    data = job.prepare(task) if pending else None
    if line := reused_seeds(task.label, job.seeds, pending, out):
        say(command, line)
    for seed in pending:
        path = seed_dir(out, task.name, seed)
        if path.exists():
            shutil.rmtree(path)  # an interrupted seed (no run.json): start it again
        say(command, f"{task.label} seed {seed}: {'fine-tuning' if task.trains else 'predicting'} on {processes()}")
        with seed_attempt(path):
            lines = job.train_seed(task, seed, data, path, identity)
        for line in lines:
            say(command, f"{task.label} seed {seed}: {line}")
        drop_replaced_if_standing(out, job.layout)  # the job --overwrite replaces goes once this one has a seed


def publish(job: FineTuneJob, name: str, best: int, seeds: list[int]) -> Path | None:
    """models/<name>/ <- the best seed's model (`publish_best`)."""
    seed_dirs = {seed: seed_dir(job.output_dir, name, seed) for seed in seeds}
    return publish_best(job.output_dir, name, seed_dirs, best, finished_run(seed_dirs[best]), job.save_models,
                        keep_seed_models=name in job.keeps_seed_models)
