"""A GLUE task's splits, tokenized for fine-tuning."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset, Value
from transformers import PreTrainedTokenizerBase

from convattn.console import say
from convattn.data.glue import GlueTask, has_split, load_split
from convattn.training.glue.settings import GlueSettings


@dataclass
class TaskData:
    train: Dataset | None
    dev: dict[str, Dataset]     # dev split -> encoded dataset (with labels)
    test: dict[str, Dataset]    # test split -> encoded dataset (no labels), keeps `idx`


def encode(dataset: Dataset, tokenizer: PreTrainedTokenizerBase, max_length: int, token_types: bool) -> Dataset:
    pair = "text_b" in dataset.column_names

    def tokenize(batch):
        return tokenizer(batch["text_a"], batch["text_b"] if pair else None, truncation=True, max_length=max_length,
                         return_token_type_ids=token_types)

    texts = [c for c in ("text_a", "text_b") if c in dataset.column_names]
    encoded = dataset.map(tokenize, batched=True, remove_columns=texts)
    if "label" in encoded.column_names and encoded.features["label"].dtype == "float64":
        encoded = encoded.cast_column("label", Value("float32"))
    return encoded


@dataclass
class TaskSplits:
    """A task's splits as read (text, not yet tokenized): every file checked before anything is written."""
    train: Dataset | None
    dev: dict[str, Dataset]
    test: dict[str, Dataset]


def read_task_splits(task: GlueTask, data_dir: Path | None, max_train_samples: int = 0) -> TaskSplits:
    """The splits a task uses (a fixed random subset of `max_train_samples` training examples, 0: all), each file
    read and checked."""
    train = None
    if task.trains:
        train = load_split(task, "train", data_dir)
        if 0 < max_train_samples < len(train):
            train = train.shuffle(seed=0).select(range(max_train_samples))
    dev = {split: load_split(task, split, data_dir) for split in task.dev_columns}
    test = {split: load_split(task, split, data_dir) for split in task.test_files if has_split(task, split, data_dir)}
    if data_dir is not None and len(test) < len(task.test_files):
        say("glue", f"{task.name}: no test file in {data_dir / task.folder}; no test predictions")
    return TaskSplits(train, dev, test)


def encode_task(splits: TaskSplits, tokenizer: PreTrainedTokenizerBase, settings: GlueSettings,
                token_types: bool) -> TaskData:
    def encoded(dataset: Dataset) -> Dataset:
        return encode(dataset, tokenizer, settings.max_length, token_types)

    return TaskData(train=None if splits.train is None else encoded(splits.train),
                    dev={split: encoded(d) for split, d in splits.dev.items()},
                    test={split: encoded(d) for split, d in splits.test.items()})


def check_data(tasks: list[GlueTask], data_dir: Path | None) -> None:
    if data_dir is None:
        return
    if not data_dir.is_dir():
        raise FileNotFoundError(f"--data-dir {data_dir} is not a directory")
    for task in tasks:
        needed = ["train", *task.dev_columns] if task.trains else list(task.test_files)
        for split in needed:
            if not has_split(task, split, data_dir):
                raise FileNotFoundError(f"no {task.name} {split} data: {task.tsv_path(data_dir, split)} does not "
                                        "exist")


def check_task_files(tasks: list[GlueTask], data_dir: Path | None) -> None:
    """`check_data`, and every split of the tasks read and checked (local files, or the hub's): for a job that
    fine-tunes only after hours of pretraining (a comparison)."""
    check_data(tasks, data_dir)
    for task in tasks:
        read_task_splits(task, data_dir)
