"""The GLUE job (the papers' protocol): check everything, fine-tune each task x seed (a run; finished runs
skipped), aggregate."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from convattn.console import log_to, processes, say, say_launch
from convattn.data.glue import get_task
from convattn.errors import UsageError, option
from convattn.runs.finetune import GLUE_MODEL_RECORD, check_restartable, foreign_files, layout, reused_seeds
from convattn.runs.folder import check_output_folder, run_folder_lock, seed_dir
from convattn.runs.replace import drop_replaced_if_standing, recover_replaced_run, replaces, replacing
from convattn.training.finetune.failures import new_job, seed_attempt
from convattn.training.finetune.models import check_save_models, publish_best
from convattn.training.finetune.pretrained import PretrainedModel, check_same_model, fitted_max_length, load_pretrained
from convattn.training.finetune.settings import check_trains, given_overrides
from convattn.training.finetune.trainer import check_finished_settings, check_no_more_seeds, finished_run
from convattn.training.glue.data import TaskSplits, check_data, encode_task, read_task_splits
from convattn.training.glue.results import aggregate
from convattn.training.glue.run import fine_tune, mnli_model_dir, predict_ax
from convattn.training.glue.settings import GlueSettings, load_glue_recipe, resolve_settings

MODEL_FILE = GLUE_MODEL_RECORD  # the model every run of the folder fine-tuned
GLUE = layout("glue")  # what --overwrite moves aside and gives back


def check_finished_runs(output_dir: Path, settings: dict[str, GlueSettings], seeds: int) -> None:
    for task, task_settings in settings.items():
        check_no_more_seeds(seed_dir(output_dir, task), seeds)
        for seed in range(seeds):
            check_finished_settings(seed_dir(output_dir, task, seed), task_settings)


def check_mnli_available(output_dir: Path, tasks: list[str], settings: dict[str, GlueSettings],
                         seeds: int, replace: bool = False) -> None:
    """AX and --from-mnli tasks need the same seed's MNLI model: from this invocation or a finished run (not one
    of the job --overwrite replaces)."""
    dependents = [t for t in tasks if t == "ax" or settings[t].from_mnli]
    if not dependents or "mnli" in tasks:
        return
    missing = [s for s in range(seeds) if replace or not (mnli_model_dir(output_dir, s) / "config.json").is_file()]
    if missing:
        raise UsageError(f"{', '.join(dependents)} need(s) the MNLI-tuned model of seeds {missing}, not found under "
                         f"{output_dir / 'runs' / 'mnli'}; add mnli to {option('task')}")


def fitted_settings(settings: GlueSettings, given: frozenset[str], pretrained: PretrainedModel) -> GlueSettings:
    """The settings with a max length the model and its tokenizer can take (see `fitted_max_length`); `given`: the
    fields the command line chose."""
    shortest = pretrained.tokenizer.num_special_tokens_to_add(pair=True) + 2  # a token of each text
    if settings.max_length < shortest:
        raise UsageError(f"{option('max_length')} {settings.max_length} leaves no room for the text: give at least "
                         f"{shortest} "
                         f"({shortest - 2} special tokens and a token of each sentence)")
    max_length = fitted_max_length(settings.max_length, "max_length" in given, pretrained, "glue")
    return dataclasses.replace(settings, max_length=max_length)


def run_glue(model: str, tasks: list[str], output_dir: Path, data_dir: Path | None = None, recipe: str = "chang2021",
             seeds: int | None = None, overrides: dict | None = None, task_lr: dict[str, float] | None = None,
             from_mnli: bool = False, save_models: str = "best", overwrite: bool = False) -> dict:
    """Fine-tune `model` on `tasks` for each seed (skipping finished runs), then aggregate everything in output_dir.
    `overwrite`: replace the job output_dir holds (kept aside until the first seed of the new one finishes)."""
    check_save_models(save_models)
    glue_recipe = load_glue_recipe(recipe)
    seeds = seeds or glue_recipe.seeds
    task_lr = task_lr or {}
    for name in task_lr:
        get_task(name)
        if name not in tasks or not get_task(name).trains:
            trained = [t for t in tasks if get_task(t).trains]
            raise UsageError(f"{option('task_lr')} {name}={task_lr[name]:g}: {name} is not fine-tuned in this job; "
                             f"give it for one of the tasks run ({', '.join(trained) or 'none'}), or add {name} to "
                             f"{option('task')}")
    check_data([get_task(t) for t in tasks], data_dir)
    check_output_folder(output_dir)
    pretrained = load_pretrained(model, "glue", "fine-tuning it with its own transformers classification head")
    overrides = given_overrides(overrides)
    given = frozenset(overrides)  # chosen on the command line: refused where they do not fit the model, not fitted
    # AX is only predicted, with the MNLI model: it takes MNLI's settings (max length)
    settings = {t: fitted_settings(resolve_settings(glue_recipe, "mnli" if t == "ax" else t, pretrained.base_size,
                                                    overrides, task_lr, from_mnli), given, pretrained) for t in tasks}
    with run_folder_lock(output_dir):
        recover_replaced_run(output_dir, GLUE)
        replace = replaces(output_dir, GLUE, lambda out: foreign_files(out, "glue"), overwrite)
        if not replace:  # the runs of the job replaced are neither reused nor checked
            check_finished_runs(output_dir, settings, seeds)
        check_mnli_available(output_dir, tasks, settings, seeds, replace)
        pending = {name: list(range(seeds)) if replace else pending_seeds(output_dir, name, seeds) for name in tasks}
        check_restartable(output_dir, "glue", [seed_dir(output_dir, name, s) for name in tasks for s in pending[name]])
        # every file a pending task reads, read and checked before the first write
        splits = {name: read_task_splits(get_task(name), data_dir, settings[name].max_train_samples)
                  for name in tasks if pending[name]}
        for name, split in splits.items():
            if split.train is not None:
                check_trains(settings[name], len(split.train), name)
        with replacing(output_dir, GLUE, replace), new_job(output_dir, GLUE):
            identity = check_same_model(output_dir, model, MODEL_FILE)  # the first write
            log_to(output_dir)
            say_launch("glue")
            for name in tasks:
                run_task(name, output_dir, splits.get(name), settings, pending[name], seeds, model, identity,
                         pretrained, save_models != "none")
            results = aggregate(output_dir)
            results["models"] = publish_models(output_dir, results, save_models)
        return results


def publish_models(output_dir: Path, results: dict, save_models: str) -> list[str]:
    """models/<task>/ for every trained task: its best dev seed's model (MNLI's seeds keep theirs: AX and
    --from-mnli start from them)."""
    published = []
    for name, entry in results["tasks"].items():
        if "best_seed" not in entry:
            continue
        best = entry["best_seed"]
        seed_dirs = {seed: seed_dir(output_dir, name, seed) for seed in entry["seeds"]}
        run = finished_run(seed_dirs[best])
        if publish_best(output_dir, name, seed_dirs, best, run, save_models, keep_seed_models=name == "mnli"):
            published.append(name)
    return published


def pending_seeds(output_dir: Path, name: str, seeds: int) -> list[int]:
    """The seeds of a task without a finished run (an interrupted one starts again)."""
    return [s for s in range(seeds) if finished_run(seed_dir(output_dir, name, s)) is None]


def run_task(name: str, output_dir: Path, splits: TaskSplits | None, settings: dict[str, GlueSettings],
             pending: list[int], seeds: int, model: str, identity: str, pretrained: PretrainedModel,
             save_model: bool) -> None:
    """The `pending` seeds of one task, each from `model` as it was when the job started (`identity`: its
    fingerprint) or from the same seed's MNLI model."""
    task = get_task(name)
    if line := reused_seeds(name, seeds, pending, output_dir):
        say("glue", line)
    if not pending:
        return
    tokenizer = pretrained.tokenizer
    data = encode_task(splits, tokenizer, settings[name], pretrained.token_types)
    for seed in pending:
        path = seed_dir(output_dir, name, seed)
        if path.exists():
            shutil.rmtree(path)  # an interrupted run: start it again
        say("glue", f"{name} seed {seed}: {'predicting' if not task.trains else 'fine-tuning'} on {processes()}")
        if task.trains:
            from_mnli = settings[name].from_mnli
            source = str(mnli_model_dir(output_dir, seed)) if from_mnli else model
            with seed_attempt(path):
                run = fine_tune(task, seed, settings[name], data, source, tokenizer, path,
                                save_model=save_model or name == "mnli", identity=None if from_mnli else identity)
            scores = ", ".join(f"{column} {score:.1f}" for column, score in run["scores"].items())
            say("glue", f"{name} seed {seed}: {scores}")
            for warning in run["warnings"]:
                say("glue", f"{name} seed {seed}: warning: {warning}")
        else:
            with seed_attempt(path):
                predict_ax(task, seed, data, output_dir, tokenizer, path)
        drop_replaced_if_standing(output_dir, GLUE)  # a job --overwrite replaces goes once this one has a seed
