"""The fine-tuned models a run keeps: each seed saves its model into its folder (`model/`); once a task is
aggregated, the best-dev seed's model is published as `models/<task>/` (model, config, tokenizer: what a
pipeline, `convattn push` or `convattn export` takes) and, unless every seed's model is asked for, the other
seeds' models are removed. Seeds whose model another run needs (GLUE's MNLI models, the start of AX and
--from-mnli tasks) keep theirs."""

from __future__ import annotations

import shutil
from pathlib import Path

from convattn.errors import UsageError, option
from convattn.files import read_json, staging_dir, write_json_atomic
from convattn.hub import FINE_TUNED_RECORD, fine_tuned_card

SAVE_MODELS = ("best", "all", "none")  # which fine-tuned models a run keeps
MODEL_DIR = "model"  # in a seed's folder
PUBLISHED = "models"  # in the output folder: models/<task>/
RECORD = FINE_TUNED_RECORD  # beside a published model: which seed it is, and its dev scores


def save_fine_tuned(trainer, seed_folder: Path) -> Path:
    """The seed's model into `seed_folder`/model, written beside it first so that it appears whole or not at all
    (a failure, a full disk among them, removes what was written)."""
    staging, target = seed_folder / f"{MODEL_DIR}.partial", seed_folder / MODEL_DIR
    try:
        trainer.save_model(str(staging))
        staging.replace(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def check_save_models(save_models: str) -> str:
    if save_models not in SAVE_MODELS:
        raise UsageError(f"{option('save_models')} {save_models!r} is not known; choose one of "
                         f"{', '.join(SAVE_MODELS)}")
    return save_models


def publish_best(output_dir: Path, task: str, seed_dirs: dict[int, Path], best: int, run: dict,
                 save_models: str, keep_seed_models: bool = False) -> Path | None:
    """models/<task>/ <- the best seed's model (when it changed), with a model card naming the task and its dev
    scores (`run`: the seed's run.json); other seeds' models go unless kept. Returns the published folder, or
    None when there is no model to publish."""
    target = Path(output_dir) / PUBLISHED / task
    record = {"task": task, "seed": best, "scores": run["scores"], "model": run["model"],
              "source": str(seed_dirs[best] / MODEL_DIR)}
    source = seed_dirs[best] / MODEL_DIR
    if save_models != "none" and (source / "config.json").is_file() and read_json(target / RECORD) != record:
        staging = staging_dir(target)
        try:
            shutil.copytree(source, staging, dirs_exist_ok=True)
            write_json_atomic(staging / RECORD, record)
            fine_tuned_card(staging, task, record, "question-answering" if task.startswith("squad") else
                            "text-classification", published_as=target)
            if target.exists():
                shutil.rmtree(target)
            staging.replace(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    if save_models != "all" and not keep_seed_models:
        for path in seed_dirs.values():
            if (path / MODEL_DIR).is_dir():
                shutil.rmtree(path / MODEL_DIR)
    return target if (target / RECORD).is_file() else None
