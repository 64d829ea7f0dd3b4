"""One fine-tuning run (a task and a seed) and where it is written.

    runs/<task>/seed<k>/run.json     finished-run marker (settings, dev metrics, column scores); written last
    runs/<task>/seed<k>/log.json     the Trainer's log history
    runs/<task>/seed<k>/predictions/ test-set predictions in the GLUE submission format
    runs/mnli/seed<k>/model/         the MNLI-tuned model (for AX and --from-mnli)
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch
from transformers import (
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
    set_seed,
)

from convattn.checkpoint import load_checked
from convattn.data.glue import GlueTask
from convattn.files import write_json_atomic, write_text_atomic
from convattn.runs.environment import SOURCE, source_digest
from convattn.runs.folder import seed_dir
from convattn.training.finetune.models import save_fine_tuned
from convattn.training.finetune.optim import LayerDecayTrainer
from convattn.training.finetune.pretrained import check_unchanged
from convattn.training.finetune.trainer import (
    RUN_FILE,
    fine_tuning_arguments,
    padding_collator,
    quiet_trainer,
    train_quietly,
)
from convattn.training.glue.data import TaskData
from convattn.training.glue.metrics import (
    column_score,
    constant_prediction_warning,
    logits_to_predictions,
    one_class_warning,
    score_predictions,
    submission_text,
)
from convattn.training.glue.settings import GlueSettings
from convattn.training.guards import check_finite_weights


def mnli_model_dir(output_dir: Path, seed: int) -> Path:
    return seed_dir(output_dir, "mnli", seed) / "model"


def predict_test_sets(trainer: Trainer, task: GlueTask, data: TaskData, path: Path, label_task: GlueTask) -> list[str]:
    files = []
    for split, dataset in data.test.items():
        logits = trainer.predict(dataset).predictions
        text = submission_text(label_task, logits_to_predictions(label_task, logits), dataset["idx"])
        write_text_atomic(path / "predictions" / task.test_files[split], text)
        files.append(task.test_files[split])
    return files


def fine_tune(task: GlueTask, seed: int, settings: GlueSettings, data: TaskData, model_source: str,
              tokenizer: PreTrainedTokenizerBase, path: Path, save_model: bool, identity: str | None) -> dict:
    """Fine-tune one seed on one task, score every dev set, predict the test sets; returns (and writes) run.json.
    `identity`: the fingerprint `model_source` must still have once loaded (None: a model this job made, MNLI's)."""
    start = time.time()
    set_seed(seed)  # the new head's initialisation
    model = load_checked(
        AutoModelForSequenceClassification, model_source, num_labels=task.num_labels, id2label=task.id2label,
        label2id=task.label2id,
    )
    check_unchanged(model_source, identity)
    trainer = LayerDecayTrainer(
        model=model, args=fine_tuning_arguments(path, settings, seed, "glue"), train_dataset=data.train,
        data_collator=padding_collator(DataCollatorWithPadding, tokenizer, settings), processing_class=tokenizer,
        layer_decay=settings.layer_decay,
    )
    train_output = train_quietly(trainer)
    check_finite_weights(model, f"the {task.name} model of seed {seed} after fine-tuning")
    metrics, warnings = {}, []
    for split, dataset in data.dev.items():
        predictions = logits_to_predictions(task, trainer.predict(dataset).predictions)
        metrics[split] = score_predictions(task, predictions, np.asarray(dataset["label"]))
        if warning := one_class_warning(task, split, predictions) or constant_prediction_warning(task, split,
                                                                                               predictions):
            warnings.append(warning)
    files = predict_test_sets(trainer, task, data, path, task)
    if save_model:
        save_fine_tuned(trainer, path)
    write_json_atomic(path / "log.json", trainer.state.log_history)
    run = {
        "task": task.name, "seed": seed, "model": model_source,
        "init": f"mnli seed {seed}" if settings.from_mnli else "pretrained",
        "settings": dataclasses.asdict(settings),
        "encoder_params": model.base_model.num_parameters(),
        "metrics": metrics,
        "scores": {task.dev_columns[split]: column_score(m) for split, m in metrics.items()},
        "warnings": warnings,
        "train": {"steps": train_output.global_step, "loss": train_output.training_loss,
                  "examples": len(data.train)},
        "test_predictions": files,
        "seconds": round(time.time() - start, 1),
        SOURCE: source_digest(),
    }
    write_json_atomic(path / RUN_FILE, run)
    return run


def predict_ax(task: GlueTask, seed: int, data: TaskData, output_dir: Path, tokenizer: PreTrainedTokenizerBase,
               path: Path) -> dict:
    """AX (the diagnostic set) is predicted with the same seed's MNLI model; it has no dev set."""
    model = load_checked(AutoModelForSequenceClassification, str(mnli_model_dir(output_dir, seed)),
                         allow_new_head=False)
    args = TrainingArguments(output_dir=str(path), per_device_eval_batch_size=128, report_to="none",
                             dataloader_pin_memory=torch.cuda.is_available())
    trainer = quiet_trainer(Trainer(model=model, args=args, data_collator=DataCollatorWithPadding(tokenizer),
                                    processing_class=tokenizer))
    files = predict_test_sets(trainer, task, data, path, task)
    run = {"task": task.name, "seed": seed, "model": str(mnli_model_dir(output_dir, seed)), "init": "mnli",
           "settings": None, "metrics": {}, "scores": {}, "test_predictions": files, SOURCE: source_digest()}
    write_json_atomic(path / RUN_FILE, run)
    return run
