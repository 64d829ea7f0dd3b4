"""The GLUE job (the papers' protocol): GLUE's tasks, settings and scoring in the fine-tuning driver's order
(`run_job`: check everything, fine-tune each task x seed, finished runs skipped, aggregate)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from convattn.data.glue import get_task
from convattn.errors import UsageError, option
from convattn.runs.finetune import layout
from convattn.training.finetune.driver import FineTuneJob, Publish, Task, run_job
from convattn.training.finetune.pretrained import PretrainedModel, fitted_max_length
from convattn.training.finetune.settings import check_trains, given_overrides
from convattn.training.glue.data import TaskData, TaskSplits, check_data, encode_task, read_task_splits
from convattn.training.glue.results import aggregate
from convattn.training.glue.run import fine_tune, mnli_model_dir, predict_ax
from convattn.training.glue.settings import GlueRecipe, GlueSettings, load_glue_recipe, resolve_settings

GLUE = layout("glue")  # what --overwrite moves aside and gives back


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
    return run_job(GlueJob(model=model, output_dir=output_dir, seeds=seeds, save_models=save_models,
                           overwrite=overwrite, tasks=tasks, data_dir=data_dir, recipe=recipe,
                           overrides=overrides or {}, task_lr=task_lr or {}, from_mnli=from_mnli))


@dataclass(kw_only=True)
class GlueJob(FineTuneJob):
    """GLUE's pieces of the fine-tuning protocol: each task's data, settings and scores."""

    tasks: list[str]
    data_dir: Path | None
    recipe: str
    overrides: dict
    task_lr: dict[str, float]
    from_mnli: bool
    # what the driver's calls find, in its order: the recipe, the model and each task's settings, the data
    glue_recipe: GlueRecipe = field(init=False)
    pretrained: PretrainedModel = field(init=False)
    settings: dict[str, GlueSettings] = field(init=False)
    splits: dict[str, TaskSplits] = field(init=False)

    layout = GLUE
    foreign_use = "fine-tuning it with its own transformers classification head"
    keeps_seed_models = frozenset({"mnli"})  # AX and --from-mnli tasks start from the same seed's MNLI model

    def check_inputs(self) -> None:
        self.glue_recipe = load_glue_recipe(self.recipe)
        self.seeds = self.seeds or self.glue_recipe.seeds
        for name in self.task_lr:
            get_task(name)
            if name not in self.tasks or not get_task(name).trains:
                trained = [t for t in self.tasks if get_task(t).trains]
                raise UsageError(f"{option('task_lr')} {name}={self.task_lr[name]:g}: {name} is not fine-tuned in "
                                 f"this job; give it for one of the tasks run ({', '.join(trained) or 'none'}), or "
                                 f"add {name} to {option('task')}")
        check_data([get_task(t) for t in self.tasks], self.data_dir)

    def fitted_tasks(self, pretrained: PretrainedModel) -> list[Task]:
        self.pretrained = pretrained
        given = frozenset(given_overrides(self.overrides))  # the command line's: refused where they do not fit
        # AX is only predicted, with the MNLI model: it takes MNLI's settings (max length)
        self.settings = {t: fitted_settings(resolve_settings(self.glue_recipe, "mnli" if t == "ax" else t,
                                                             pretrained.base_size, self.overrides, self.task_lr,
                                                             self.from_mnli), given, pretrained) for t in self.tasks}
        return [Task(t, t, self.settings[t], trains=get_task(t).trains) for t in self.tasks]

    def check_folder(self, replace: bool) -> None:
        check_mnli_available(self.output_dir, self.tasks, self.settings, self.seeds, replace)

    def read_data(self, names: list[str]) -> None:
        self.splits = {name: read_task_splits(get_task(name), self.data_dir, self.settings[name].max_train_samples)
                       for name in names}
        for name, split in self.splits.items():
            if split.train is not None:
                check_trains(self.settings[name], len(split.train), name)

    def prepare(self, task: Task) -> TaskData:
        tokenizer, token_types = self.pretrained.tokenizer, self.pretrained.token_types
        return encode_task(self.splits[task.name], tokenizer, task.settings, token_types)

    def train_seed(self, task: Task, seed: int, data: TaskData, path: Path, identity: str) -> list[str]:
        """A seed fine-tuned from the model as it was when the job started (`identity`: its fingerprint) or from
        the same seed's MNLI model; AX's seed predicted with that MNLI model."""
        glue_task, tokenizer = get_task(task.name), self.pretrained.tokenizer
        if not task.trains:
            predict_ax(glue_task, seed, data, self.output_dir, tokenizer, path)
            return []
        from_mnli = task.settings.from_mnli
        source = str(mnli_model_dir(self.output_dir, seed)) if from_mnli else self.model
        run = fine_tune(glue_task, seed, task.settings, data, source, tokenizer, path,
                        save_model=self.save_models != "none" or task.name in self.keeps_seed_models,
                        identity=None if from_mnli else identity)
        scores = ", ".join(f"{column} {score:.1f}" for column, score in run["scores"].items())
        return [scores, *(f"warning: {warning}" for warning in run["warnings"])]

    def aggregate(self, publish: Publish) -> dict:
        """glue_results.*, submission/; models/<task>/ for every trained task (`results["models"]`)."""
        results = aggregate(self.output_dir)
        results["models"] = [name for name, entry in results["tasks"].items()
                             if "best_seed" in entry and publish(name, entry["best_seed"], entry["seeds"])]
        return results
