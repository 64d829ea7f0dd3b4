"""One fine-tuning run (a seed) and what it writes.

    runs/squad<version>/seed<k>/run.json                  finished-run marker (settings, scores); written last
    runs/squad<version>/seed<k>/predictions.json          question id -> answer, the official scripts' input
    runs/squad<version>/seed<k>/nbest_predictions.json    question id -> n-best spans with probabilities
    runs/squad<version>/seed<k>/null_odds.json            SQuAD 2.0: the no-answer odds the threshold search uses
    runs/squad<version>/seed<k>/log.json                  the Trainer's log history
    runs/squad<version>/seed<k>/model/                    the fine-tuned model, until the best seed's is published
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from torch.utils.data import DataLoader
from transformers import AutoModelForQuestionAnswering, DataCollatorWithPadding, PreTrainedTokenizerBase, set_seed

from convattn.checkpoint import load_checked
from convattn.data.squad import official_answers
from convattn.files import write_json_atomic
from convattn.runs.environment import SOURCE, source_digest
from convattn.runs.folder import seed_dir
from convattn.training.finetune.models import save_fine_tuned
from convattn.training.finetune.optim import LayerDecayTrainer
from convattn.training.finetune.pretrained import check_unchanged
from convattn.training.finetune.trainer import RUN_FILE, fine_tuning_arguments, padding_collator, train_quietly
from convattn.training.guards import check_finite_weights
from convattn.training.squad.features import Progress
from convattn.training.squad.metrics import squad_scores
from convattn.training.squad.postprocess import best_answers
from convattn.training.squad.settings import SquadSettings


@dataclass
class SquadData:
    train: Dataset          # training windows with start/end positions
    train_questions: int
    dev: Dataset            # dev questions (id, context, answers)
    dev_windows: Dataset    # their windows with offsets and max-context flags


def squad_seed_dir(output_dir: Path, version: str, seed: int) -> Path:
    return seed_dir(output_dir, f"squad{version}", seed)


PREDICT_BATCH = 16  # the joint head scores beam x n end positions per window
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "answer_mask")


class SquadCollator(DataCollatorWithPadding):
    """Pads the tokenizer's fields, and the joint head's per-token `answer_mask` with zeros."""

    def __call__(self, features: list[dict]) -> dict:
        masks = [f.pop("answer_mask") for f in features] if "answer_mask" in features[0] else None
        batch = super().__call__(features)
        if masks is not None:
            width = batch["input_ids"].shape[1]
            batch["answer_mask"] = torch.tensor([m + [0] * (width - len(m)) for m in masks])
        return batch


def predict_windows(model, windows: Dataset, collator: SquadCollator) -> dict[str, list[np.ndarray]]:
    """Every output of the model for every window, in order (per-window arrays; positions past a window's
    length are padding)."""
    inputs = windows.select_columns([c for c in MODEL_INPUTS if c in windows.column_names])
    outputs: dict[str, list[np.ndarray]] = {}
    progress = Progress("answering the dev questions", len(inputs), "windows")
    model.eval()
    with torch.no_grad():
        for batch in DataLoader(inputs, batch_size=PREDICT_BATCH, collate_fn=collator):
            result = model(**{k: v.to(model.device) for k, v in batch.items()})
            for name, value in result.items():
                if isinstance(value, torch.Tensor):
                    outputs.setdefault(name, []).extend(value.float().cpu().numpy())
            progress.advance(len(batch["input_ids"]))
    return outputs


def load_qa_model(model_source: str, head: str):
    """The pretrained encoder with a new QA head: convattn models take `head`; others keep their own span head."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_source)
    extra = {"qa_head": head} if config.model_type == "convattn" else {}
    return load_checked(AutoModelForQuestionAnswering, model_source, **extra)


def fine_tune(version: str, seed: int, settings: SquadSettings, data: SquadData, model_source: str,
              tokenizer: PreTrainedTokenizerBase, path: Path, save_model: bool = False,
              identity: str | None = None) -> dict:
    """Fine-tune one seed, answer every dev question and score the answers; returns (and writes) run.json.
    `identity`: the fingerprint `model_source` must still have once loaded."""
    start = time.time()
    set_seed(seed)  # the new span head's initialisation and the data order
    model = load_qa_model(model_source, settings.head)
    check_unchanged(model_source, identity)
    collator = padding_collator(SquadCollator, tokenizer, settings)
    trainer = LayerDecayTrainer(
        model=model, args=fine_tuning_arguments(path, settings, seed, "squad"), train_dataset=data.train,
        data_collator=collator, processing_class=tokenizer, layer_decay=settings.layer_decay,
    )
    train_output = train_quietly(trainer)
    check_finite_weights(model, f"the SQuAD model of seed {seed} after fine-tuning")
    outputs = predict_windows(model, data.dev_windows, collator)
    answers = best_answers(data.dev, data.dev_windows, outputs, settings.n_best, settings.max_answer_length,
                           version)
    scores = squad_scores(official_answers(data.dev), answers.predictions, version,
                          no_answer_probs=answers.null_odds if version == "2.0" else None)
    write_json_atomic(path / "predictions.json", answers.predictions)
    write_json_atomic(path / "nbest_predictions.json", answers.nbest)
    if version == "2.0":
        write_json_atomic(path / "null_odds.json", answers.null_odds)
    if save_model:
        save_fine_tuned(trainer, path)
    write_json_atomic(path / "log.json", trainer.state.log_history)
    run = {
        "version": version, "seed": seed, "model": model_source,
        "settings": dataclasses.asdict(settings),
        "encoder_params": model.base_model.num_parameters(),
        "scores": scores,
        "train": {"steps": train_output.global_step, "loss": train_output.training_loss,
                  "questions": data.train_questions, "windows": len(data.train)},
        "dev": {"questions": len(data.dev), "windows": len(data.dev_windows)},
        "seconds": round(time.time() - start, 1),
        SOURCE: source_digest(),
    }
    write_json_atomic(path / RUN_FILE, run)
    return run
