"""The SQuAD job (ELECTRA's protocol): SQuAD's data, settings and scoring in the fine-tuning driver's order
(`run_job`: check everything, fine-tune each seed, finished seeds skipped, aggregate)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from convattn.console import say
from convattn.data.squad import check_regular_file, check_version, load_squad
from convattn.errors import UsageError
from convattn.runs.finetune import layout
from convattn.training.finetune.driver import FineTuneJob, Publish, Task, run_job
from convattn.training.finetune.pretrained import PretrainedModel, fitted_max_length
from convattn.training.finetune.recipes import FineTuneRecipe
from convattn.training.finetune.settings import check_trains, given_overrides
from convattn.training.squad.features import encode_split
from convattn.training.squad.results import aggregate
from convattn.training.squad.run import SquadData, fine_tune
from convattn.training.squad.settings import SquadSettings, fitted_windows, load_squad_recipe, resolve_settings

SQUAD = layout("squad")  # what --overwrite moves aside and gives back


def load_data(version: str, train_file: Path | None, dev_file: Path | None, tokenizer, settings: SquadSettings,
              token_types: bool) -> SquadData:
    train = load_squad(version, "train", train_file)
    if 0 < settings.max_train_samples < len(train):
        train = train.shuffle(seed=0).select(range(settings.max_train_samples))
    dev = load_squad(version, "dev", dev_file)
    return SquadData(train=encode_split(train, tokenizer, settings, token_types, training=True),
                     train_questions=len(train), dev=dev,
                     dev_windows=encode_split(dev, tokenizer, settings, token_types, training=False))


def fitted_settings(settings: SquadSettings, given: frozenset[str], pretrained: PretrainedModel) -> SquadSettings:
    """The settings checked against the model: a max length its positions allow, windows that agree, the span
    head for models other than convattn (ELECTRA's joint head is convattn's). The fields `given` on the command
    line are refused when they do not fit; the recipe's values are lowered to fit."""
    max_length = fitted_max_length(settings.max_length, "max_length" in given, pretrained, "squad")
    head = settings.head if pretrained.folder.is_convattn else "span"
    settings = dataclasses.replace(settings, max_length=max_length, head=head)
    return fitted_windows(settings, pretrained.tokenizer.num_special_tokens_to_add(pair=True), "doc_stride" in given)


def run_squad(model: str, version: str, output_dir: Path, train_file: Path | None = None,
              dev_file: Path | None = None, recipe: str = "convbert", seeds: int | None = None,
              overrides: dict | None = None, save_models: str = "best", overwrite: bool = False) -> dict:
    """Fine-tune `model` on SQuAD `version` for each seed (skipping finished ones), then aggregate output_dir.
    `overwrite`: replace the job output_dir holds (kept aside until the first seed of the new one finishes)."""
    return run_job(SquadJob(model=model, output_dir=output_dir, seeds=seeds, save_models=save_models,
                            overwrite=overwrite, version=version, train_file=train_file, dev_file=dev_file,
                            recipe=recipe, overrides=overrides or {}))


@dataclass(kw_only=True)
class SquadJob(FineTuneJob):
    """SQuAD's pieces of the fine-tuning protocol: one version's questions, settings and scores."""

    version: str
    train_file: Path | None
    dev_file: Path | None
    recipe: str
    overrides: dict
    # what the driver's calls find, in its order: the recipe, the model and the settings, the data
    squad_recipe: FineTuneRecipe = field(init=False)
    pretrained: PretrainedModel = field(init=False)
    settings: SquadSettings = field(init=False)
    data: SquadData = field(init=False)

    layout = SQUAD
    foreign_use = "fine-tuning it with its own transformers span head (head=span, not ELECTRA's joint head)"

    def check_inputs(self) -> None:
        check_version(self.version)
        # a missing file first: it is the cause, not settings that differ
        for given in (self.train_file, self.dev_file):
            if given is not None:
                check_regular_file(Path(given))
        self.squad_recipe = load_squad_recipe(self.recipe)
        self.seeds = self.seeds or self.squad_recipe.seeds

    def fitted_tasks(self, pretrained: PretrainedModel) -> list[Task]:
        if not pretrained.tokenizer.is_fast:
            raise UsageError(f"{self.model}: SQuAD needs a fast tokenizer (character offsets); this one is "
                             f"{type(pretrained.tokenizer).__name__}")
        self.pretrained = pretrained
        given = frozenset(given_overrides(self.overrides))  # the command line's: refused where they do not fit
        self.settings = fitted_settings(resolve_settings(self.squad_recipe, pretrained.base_size, self.overrides),
                                        given, pretrained)
        return [Task(f"squad{self.version}", f"v{self.version}", self.settings)]

    def read_data(self, names: list[str]) -> None:
        if names:
            self.data = load_data(self.version, self.train_file, self.dev_file, self.pretrained.tokenizer,
                                  self.settings, self.pretrained.token_types)
            check_trains(self.settings, len(self.data.train), f"SQuAD v{self.version}", unit="windows")

    def prepare(self, task: Task) -> SquadData:
        data = self.data
        say("squad", f"v{self.version}: {data.train_questions:,} training questions in {len(data.train):,} "
                     f"windows, {len(data.dev):,} dev questions in {len(data.dev_windows):,} windows")
        return data

    def train_seed(self, task: Task, seed: int, data: SquadData, path: Path, identity: str) -> list[str]:
        run = fine_tune(self.version, seed, self.settings, data, self.model, self.pretrained.tokenizer, path,
                        self.save_models != "none", identity)
        headline = run["scores"].get("best_f1", run["scores"]["f1"])
        em = run["scores"].get("best_exact", run["scores"].get("exact_match", run["scores"].get("exact")))
        return [f"EM {em:.1f}, F1 {headline:.1f} ({run['seconds']:.0f} s)"]

    def aggregate(self, publish: Publish) -> dict:
        """squad_results.*; models/squad<version>/ (`results["model_dir"]`) once a seed has finished."""
        results = aggregate(self.output_dir, self.version)
        if results["best_seed"] is not None:
            published = publish(f"squad{self.version}", results["best_seed"], results["seeds"])
            results["model_dir"] = str(published) if published else None
        return results
