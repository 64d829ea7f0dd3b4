"""The SQuAD job (ELECTRA's protocol): check everything, fine-tune each seed (a run; finished seeds skipped),
aggregate."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from convattn.console import log_to, processes, say, say_launch
from convattn.data.squad import check_regular_file, check_version, load_squad
from convattn.errors import UsageError
from convattn.runs.finetune import SQUAD_MODEL_RECORD, check_restartable, foreign_files, layout, reused_seeds
from convattn.runs.folder import check_output_folder, run_folder_lock
from convattn.runs.replace import drop_replaced_if_standing, recover_replaced_run, replaces, replacing
from convattn.training.finetune.failures import new_job, seed_attempt
from convattn.training.finetune.models import check_save_models, publish_best
from convattn.training.finetune.pretrained import PretrainedModel, check_same_model, fitted_max_length, load_pretrained
from convattn.training.finetune.settings import check_trains, given_overrides
from convattn.training.finetune.trainer import check_finished_settings, check_no_more_seeds, finished_run
from convattn.training.squad.features import encode_split
from convattn.training.squad.results import aggregate
from convattn.training.squad.run import SquadData, fine_tune, squad_seed_dir
from convattn.training.squad.settings import SquadSettings, fitted_windows, load_squad_recipe, resolve_settings

MODEL_FILE = SQUAD_MODEL_RECORD  # the model every seed of the folder fine-tuned
SQUAD = layout("squad")  # what --overwrite moves aside and gives back


def check_finished_runs(output_dir: Path, version: str, settings: SquadSettings, seeds: int) -> None:
    for seed in range(seeds):
        check_finished_settings(squad_seed_dir(output_dir, version, seed), settings)
    check_no_more_seeds(squad_seed_dir(output_dir, version, 0).parent, seeds)


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
    check_version(version)
    for given in (train_file, dev_file):  # a missing file first: it is the cause, not settings that differ
        if given is not None:
            check_regular_file(Path(given))
    check_save_models(save_models)
    squad_recipe = load_squad_recipe(recipe)
    seeds = seeds or squad_recipe.seeds
    overrides = given_overrides(overrides)
    given = frozenset(overrides)  # chosen on the command line: refused where they do not fit the model, not fitted
    check_output_folder(output_dir)
    pretrained = load_pretrained(model, "squad", "fine-tuning it with its own transformers span head (head=span, "
                                                 "not ELECTRA's joint head)")
    if not pretrained.tokenizer.is_fast:
        raise UsageError(f"{model}: SQuAD needs a fast tokenizer (character offsets); this one is "
                         f"{type(pretrained.tokenizer).__name__}")
    settings = fitted_settings(resolve_settings(squad_recipe, pretrained.base_size, overrides), given, pretrained)
    with run_folder_lock(output_dir):  # a failure before the first write leaves nothing behind
        recover_replaced_run(output_dir, SQUAD)
        replace = replaces(output_dir, SQUAD, lambda out: foreign_files(out, "squad"), overwrite)
        if not replace:  # the seeds of the job replaced are neither reused nor checked
            check_finished_runs(output_dir, version, settings, seeds)
        pending = [s for s in range(seeds)
                   if replace or finished_run(squad_seed_dir(output_dir, version, s)) is None]
        check_restartable(output_dir, "squad", [squad_seed_dir(output_dir, version, s) for s in pending])
        data = load_data(version, train_file, dev_file, pretrained.tokenizer, settings,
                         pretrained.token_types) if pending else None
        if data:
            check_trains(settings, len(data.train), f"SQuAD v{version}", unit="windows")
        with replacing(output_dir, SQUAD, replace), new_job(output_dir, SQUAD):
            check_same_model(output_dir, model, MODEL_FILE)  # the first write
            log_to(output_dir)
            say_launch("squad")
            if data:
                say("squad", f"v{version}: {data.train_questions:,} training questions in {len(data.train):,} "
                             f"windows, {len(data.dev):,} dev questions in {len(data.dev_windows):,} windows")
            if line := reused_seeds(f"v{version}", seeds, pending, output_dir):
                say("squad", line)
            for seed in pending:
                run_seed(version, seed, settings, data, model, pretrained.tokenizer, output_dir, save_models != "none")
                drop_replaced_if_standing(output_dir, SQUAD)  # a job --overwrite replaces goes once this one has a seed
            results = aggregate(output_dir, version)
            if results["best_seed"] is not None:
                best = results["best_seed"]
                seed_dirs = {seed: squad_seed_dir(output_dir, version, seed) for seed in results["seeds"]}
                published = publish_best(output_dir, f"squad{version}", seed_dirs, best,
                                         finished_run(seed_dirs[best]), save_models)
                results["model_dir"] = str(published) if published else None
        return results


def run_seed(version: str, seed: int, settings: SquadSettings, data: SquadData, model: str, tokenizer,
             output_dir: Path, save_model: bool) -> None:
    path = squad_seed_dir(output_dir, version, seed)
    if path.exists():
        shutil.rmtree(path)  # an interrupted seed (no run.json): start it again
    say("squad", f"v{version} seed {seed}: fine-tuning on {processes()}")
    with seed_attempt(path):
        run = fine_tune(version, seed, settings, data, model, tokenizer, path, save_model)
    headline = run["scores"].get("best_f1", run["scores"]["f1"])
    em = run["scores"].get("best_exact", run["scores"].get("exact_match", run["scores"].get("exact")))
    say("squad", f"v{version} seed {seed}: EM {em:.1f}, F1 {headline:.1f} ({run['seconds']:.0f} s)")
