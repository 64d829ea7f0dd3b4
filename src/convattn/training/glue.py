"""GLUE fine-tuning with the papers' protocol: recipes, seeds, layer-wise lr decay, metrics, results.

Layout of an output directory:
  runs/<task>/seed<k>/run.json     finished-run marker (settings, dev metrics, column scores); written last
  runs/<task>/seed<k>/log.json     the Trainer's log history
  runs/<task>/seed<k>/predictions/ test-set predictions in the GLUE submission format
  runs/mnli/seed<k>/model/         the MNLI-tuned model (for AX and --from-mnli)
  glue_results.json, glue_results.md, submission/ (best-dev seed's test predictions per task)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import yaml
from datasets import Dataset, Value
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
    set_seed,
)

from convattn.data.glue import GLUE_COLUMNS, GlueTask, get_task, has_split, load_split
from convattn.errors import UsageError

RECIPES = ("chang2021", "convbert")
BASE_HIDDEN_SIZE = 768  # models this wide get the recipe's `base_size` settings (lr 1e-4)


# ---------------------------------------------------------------- settings

@dataclass(frozen=True)
class FineTuneSettings:
    learning_rate: float
    batch_size: int
    epochs: float
    max_steps: int             # > 0 overrides epochs
    warmup_ratio: float
    weight_decay: float
    layer_decay: float
    adam_epsilon: float
    max_length: int
    max_train_samples: int     # 0 = the whole training set
    from_mnli: bool


OVERRIDABLE = ("learning_rate", "batch_size", "epochs", "max_steps", "warmup_ratio", "weight_decay", "layer_decay",
               "max_length", "max_train_samples")


def load_recipe(name: str) -> dict:
    if name not in RECIPES:
        raise UsageError(f"unknown recipe {name!r}; recipes are {', '.join(RECIPES)}")
    text = resources.files("convattn.configs").joinpath("recipes", "glue", f"{name}.yaml").read_text()
    return yaml.safe_load(text)


def resolve_settings(recipe: dict, task: str, base_size: bool, overrides: dict, task_lr: dict[str, float],
                     from_mnli: bool) -> FineTuneSettings:
    """recipe defaults < base-size settings < per-task settings < command-line overrides < per-task lr."""
    fields = {"max_steps": 0, "max_train_samples": 0, **recipe["defaults"]}
    if base_size:
        fields.update(recipe.get("base_size", {}))
    fields.update(recipe.get("tasks", {}).get(task, {}))
    fields.update({k: v for k, v in overrides.items() if v is not None})
    if task in task_lr:
        fields["learning_rate"] = task_lr[task]
    fields["from_mnli"] = from_mnli and task in recipe.get("from_mnli_tasks", ())
    settings = FineTuneSettings(**fields)
    if not 0 <= settings.warmup_ratio < 1:
        raise UsageError(f"warmup ratio must be in [0, 1), got {settings.warmup_ratio}")
    return settings


# ---------------------------------------------------------------- metrics (in points, 0-100, as in the papers)

def score_predictions(task: GlueTask, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Predicted class ids (or STS-B scores) against gold labels -> the task's metrics x 100."""
    compute = {
        "accuracy": lambda: accuracy_score(labels, predictions),
        "f1": lambda: f1_score(labels, predictions),
        "mcc": lambda: matthews_corrcoef(labels, predictions),
        "pearson": lambda: stats.pearsonr(predictions, labels).statistic,
        "spearman": lambda: stats.spearmanr(predictions, labels).statistic,
    }
    return {name: 100 * float(compute[name]()) for name in task.metrics}


def logits_to_predictions(task: GlueTask, logits: np.ndarray) -> np.ndarray:
    return logits.reshape(-1) if task.is_regression else logits.argmax(-1)


def column_score(metrics: dict[str, float]) -> float:
    """A table cell: the mean of the split's metrics (MRPC/QQP accuracy and F1, STS-B Pearson and Spearman)."""
    return float(np.mean(list(metrics.values())))


def mean_sem(values: list[float]) -> dict:
    sem = float(stats.sem(values)) if len(values) > 1 else None
    return {"mean": float(np.mean(values)), "sem": sem, "n": len(values)}


# ---------------------------------------------------------------- layer-wise learning-rate decay

LAYER_INDEX = re.compile(r"(?:^|\.)layer\.(\d+)\.")
EMBEDDINGS = re.compile(r"(?:^|\.)embeddings(?:_project)?\.")
SHARED_ENCODER = re.compile(r"(?:^|\.)encoder\.shared\.")  # convattn modules used by every layer


def layer_depths(names: list[str]) -> tuple[dict[str, int], int]:
    """ELECTRA's depths (also ConvBERT's): embeddings 0, encoder layer i -> i + 1, the rest (head, pooler)
    n_layers + 2. Works on convattn and BERT-like names (`*.embeddings.*`, `*.layer.{i}.*`)."""
    n_layers = 1 + max((int(m.group(1)) for n in names if (m := LAYER_INDEX.search(n))), default=-1)

    def depth(name: str) -> int:
        if EMBEDDINGS.search(name):
            return 0
        if m := LAYER_INDEX.search(name):
            return int(m.group(1)) + 1
        return 1 if SHARED_ENCODER.search(name) else n_layers + 2

    return {name: depth(name) for name in names}, n_layers


def layerwise_param_groups(model: nn.Module, learning_rate: float, weight_decay: float, layer_decay: float,
                           decay_names: set[str]) -> list[dict]:
    """AdamW groups with lr * layer_decay ** (n_layers + 2 - depth); no weight decay where not in decay_names."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    depths, n_layers = layer_depths([n for n, _ in params])
    groups: dict[tuple[int, bool], dict] = {}
    for name, param in params:
        decays = name in decay_names
        group = groups.setdefault((depths[name], decays), {
            "params": [],
            "weight_decay": weight_decay if decays else 0.0,
            "lr": learning_rate * layer_decay ** (n_layers + 2 - depths[name]),
        })
        group["params"].append(param)
    return list(groups.values())


class LayerDecayTrainer(Trainer):
    """Trainer whose AdamW has one parameter group per depth (layer-wise lr decay); linear warmup/decay as usual."""

    def __init__(self, *args, layer_decay: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.layer_decay = layer_decay

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            model = self.model if model is None else model
            groups = layerwise_param_groups(model, self.args.learning_rate, self.args.weight_decay, self.layer_decay,
                                            set(self.get_decay_parameter_names(model)))
            optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, model)
            self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer


# ---------------------------------------------------------------- files

def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as f:
        f.write(text)
    os.replace(f.name, path)


def write_json_atomic(path: Path, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def submission_text(task: GlueTask, predictions: np.ndarray, indices: list[int]) -> str:
    """GLUE submission format: `index<TAB>prediction`, label strings (0/1 for binary tasks), STS-B clipped to 0..5."""
    if task.is_regression:
        values = [f"{min(max(float(p), 0.0), 5.0):.3f}" for p in predictions]
    else:
        values = [task.labels[int(p)] for p in predictions]
    return "index\tprediction\n" + "".join(f"{i}\t{v}\n" for i, v in zip(indices, values, strict=True))


def run_dir(output_dir: Path, task: str, seed: int) -> Path:
    return output_dir / "runs" / task / f"seed{seed}"


def mnli_model_dir(output_dir: Path, seed: int) -> Path:
    return run_dir(output_dir, "mnli", seed) / "model"


def finished_run(path: Path) -> dict | None:
    marker = path / "run.json"
    return json.loads(marker.read_text()) if marker.is_file() else None


# ---------------------------------------------------------------- data

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


def load_task_data(task: GlueTask, data_dir: Path | None, tokenizer: PreTrainedTokenizerBase,
                   settings: FineTuneSettings, token_types: bool) -> TaskData:
    def prepared(split: str) -> Dataset:
        return encode(load_split(task, split, data_dir), tokenizer, settings.max_length, token_types)

    train = None
    if task.trains:
        train = load_split(task, "train", data_dir)
        if 0 < settings.max_train_samples < len(train):
            train = train.shuffle(seed=0).select(range(settings.max_train_samples))
        train = encode(train, tokenizer, settings.max_length, token_types)
    dev = {split: prepared(split) for split in task.dev_columns}
    test = {split: prepared(split) for split in task.test_files if has_split(task, split, data_dir)}
    if data_dir is not None and len(test) < len(task.test_files):
        print(f"[glue] {task.name}: no test file in {data_dir / task.folder}; no test predictions")
    return TaskData(train, dev, test)


# ---------------------------------------------------------------- one run

def training_arguments(path: Path, settings: FineTuneSettings, seed: int) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(path),
        learning_rate=settings.learning_rate,
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=128,
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps or -1,
        warmup_steps=settings.warmup_ratio,  # a float below 1 is a fraction of the total steps
        lr_scheduler_type="linear",
        weight_decay=settings.weight_decay,
        adam_epsilon=settings.adam_epsilon,
        seed=seed,
        save_strategy="no",
        eval_strategy="no",
        logging_steps=0.05,
        logging_first_step=True,
        report_to="none",
        dataloader_pin_memory=torch.cuda.is_available(),
    )


def predict_test_sets(trainer: Trainer, task: GlueTask, data: TaskData, path: Path, label_task: GlueTask) -> list[str]:
    files = []
    for split, dataset in data.test.items():
        logits = trainer.predict(dataset).predictions
        text = submission_text(label_task, logits_to_predictions(label_task, logits), dataset["idx"])
        write_text_atomic(path / "predictions" / task.test_files[split], text)
        files.append(task.test_files[split])
    return files


def fine_tune(task: GlueTask, seed: int, settings: FineTuneSettings, data: TaskData, model_source: str,
              tokenizer: PreTrainedTokenizerBase, path: Path, save_model: bool) -> dict:
    """Fine-tune one seed on one task, score every dev set, predict the test sets; returns (and writes) run.json."""
    start = time.time()
    set_seed(seed)  # the new head's initialisation
    model = AutoModelForSequenceClassification.from_pretrained(
        model_source, num_labels=task.num_labels, ignore_mismatched_sizes=settings.from_mnli,
        id2label=dict(enumerate(task.labels or ("score",))),
        label2id={label: i for i, label in enumerate(task.labels or ("score",))},
    )
    trainer = LayerDecayTrainer(
        model=model, args=training_arguments(path, settings, seed), train_dataset=data.train,
        data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer,
        layer_decay=settings.layer_decay,
    )
    train_output = trainer.train()
    metrics = {}
    for split, dataset in data.dev.items():
        logits = trainer.predict(dataset).predictions
        metrics[split] = score_predictions(task, logits_to_predictions(task, logits), np.asarray(dataset["label"]))
    files = predict_test_sets(trainer, task, data, path, task)
    if save_model:
        staging = path / "model.partial"
        trainer.save_model(str(staging))
        os.replace(staging, path / "model")
    write_json_atomic(path / "log.json", trainer.state.log_history)
    run = {
        "task": task.name, "seed": seed, "model": model_source,
        "init": f"mnli seed {seed}" if settings.from_mnli else "pretrained",
        "settings": dataclasses.asdict(settings),
        "encoder_params": model.base_model.num_parameters(),
        "metrics": metrics,
        "scores": {task.dev_columns[split]: column_score(m) for split, m in metrics.items()},
        "train": {"steps": train_output.global_step, "loss": train_output.training_loss,
                  "examples": len(data.train)},
        "test_predictions": files,
        "seconds": round(time.time() - start, 1),
    }
    write_json_atomic(path / "run.json", run)
    return run


def predict_ax(task: GlueTask, seed: int, data: TaskData, output_dir: Path, tokenizer: PreTrainedTokenizerBase,
               path: Path) -> dict:
    """AX (the diagnostic set) is predicted with the same seed's MNLI model; it has no dev set."""
    model = AutoModelForSequenceClassification.from_pretrained(str(mnli_model_dir(output_dir, seed)))
    args = TrainingArguments(output_dir=str(path), per_device_eval_batch_size=128, report_to="none",
                             dataloader_pin_memory=torch.cuda.is_available())
    trainer = Trainer(model=model, args=args, data_collator=DataCollatorWithPadding(tokenizer),
                      processing_class=tokenizer)
    files = predict_test_sets(trainer, task, data, path, task)
    run = {"task": task.name, "seed": seed, "model": str(mnli_model_dir(output_dir, seed)), "init": "mnli",
           "settings": None, "metrics": {}, "scores": {}, "test_predictions": files}
    write_json_atomic(path / "run.json", run)
    return run


# ---------------------------------------------------------------- aggregation

def collect_runs(output_dir: Path) -> dict[str, dict[int, dict]]:
    runs: dict[str, dict[int, dict]] = {}
    for marker in sorted((output_dir / "runs").glob("*/seed*/run.json")):
        run = json.loads(marker.read_text())
        runs.setdefault(run["task"], {})[run["seed"]] = run
    return runs


def best_seed(task_runs: dict[int, dict]) -> int:
    def task_score(seed: int) -> float:
        score = np.mean(list(task_runs[seed]["scores"].values()))
        return -math.inf if math.isnan(score) else score

    return max(sorted(task_runs), key=task_score)


def aggregate(output_dir: Path) -> dict:
    """Every finished run under output_dir -> glue_results.json, glue_results.md and submission/."""
    runs = collect_runs(output_dir)
    tasks: dict[str, dict] = {}
    columns: dict[str, dict] = {}
    for name, task_runs in runs.items():
        seeds = sorted(task_runs)
        entry: dict = {"seeds": seeds, "runs": {str(s): task_runs[s]["metrics"] for s in seeds}}
        splits = task_runs[seeds[0]]["metrics"]
        if splits:
            entry["metrics"] = {split: {metric: mean_sem([task_runs[s]["metrics"][split][metric] for s in seeds])
                                        for metric in splits[split]} for split in splits}
            entry["best_seed"] = best_seed(task_runs)
            entry["settings"] = task_runs[seeds[0]]["settings"]
            entry["init"] = task_runs[seeds[0]]["init"]
            for column in task_runs[seeds[0]]["scores"]:
                per_seed = {s: task_runs[s]["scores"][column] for s in seeds}
                columns[column] = {**mean_sem(list(per_seed.values())), "per_seed": per_seed}
        tasks[name] = entry

    present = [c for c in GLUE_COLUMNS if c in columns]
    glue: dict = {"columns": present, "complete": len(present) == len(GLUE_COLUMNS)}
    if present:
        common = set.intersection(*(set(columns[c]["per_seed"]) for c in present))
        per_seed = {s: float(np.mean([columns[c]["per_seed"][s] for c in present])) for s in sorted(common)}
        if per_seed:
            glue.update(mean_sem(list(per_seed.values())), per_seed=per_seed)

    any_run = next((r for t in runs.values() for r in t.values() if r["settings"]), None)
    results = {
        "model": any_run["model"] if any_run else None,
        "encoder_params": any_run["encoder_params"] if any_run else None,
        "tasks": tasks,
        "columns": columns,
        "glue": glue,
        "submission": collect_submission(output_dir, runs, tasks),
    }
    write_json_atomic(output_dir / "glue_results.json", results)
    write_text_atomic(output_dir / "glue_results.md", results_markdown(results))
    return results


def collect_submission(output_dir: Path, runs: dict[str, dict[int, dict]], tasks: dict[str, dict]) -> dict[str, str]:
    """Copy each task's best-dev seed's test predictions into submission/ (AX: the best MNLI seed's)."""
    chosen = {}
    for name, task_runs in runs.items():
        seed = tasks.get("mnli", {}).get("best_seed") if name == "ax" else tasks[name].get("best_seed")
        if seed not in task_runs:
            continue
        for file in task_runs[seed]["test_predictions"]:
            source = run_dir(output_dir, name, seed) / "predictions" / file
            write_text_atomic(output_dir / "submission" / file, source.read_text())
            chosen[file] = f"{name} seed {seed}"
    return chosen


def cell(stat: dict | None, digits: int = 1) -> str:
    if stat is None:
        return "–"
    if stat["sem"] is None:
        return f"{stat['mean']:.{digits}f}"
    return f"{stat['mean']:.{digits}f} ± {stat['sem']:.{digits}f}"


def results_markdown(results: dict) -> str:
    model = Path(results["model"]).name if results["model"] else "?"
    params = f"{results['encoder_params'] / 1e6:.2f}M" if results["encoder_params"] else "–"
    glue = results["glue"]
    glue_cell = cell(glue if "mean" in glue else None)
    if "mean" in glue and not glue["complete"]:
        glue_cell += "*"
    header = ["Model", "Params", *GLUE_COLUMNS, "GLUE"]
    row = [model, params, *(cell(results["columns"].get(c)) for c in GLUE_COLUMNS), glue_cell]
    lines = [
        f"# GLUE dev results: {model}",
        "",
        "Dev-set scores x 100, mean ± standard error of the mean over fine-tuning seeds (layout of Chang et al. "
        "2021, Table 6). MRPC and QQP: mean of accuracy and F1; STS: mean of Pearson and Spearman; CoLA: MCC; "
        "others: accuracy. GLUE: mean of the columns, computed per seed, then mean ± SEM over seeds (WNLI left out, "
        "as in the papers). Params: encoder without the task head.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", "---:", *["---:"] * (len(header) - 2)]) + "|",
        "| " + " | ".join(row) + " |",
    ]
    if "mean" in glue and not glue["complete"]:
        lines += ["", f"\\* partial GLUE score: mean of {', '.join(glue['columns'])} only."]
    lines += ["", "## Per metric", "", "| Task | Dev set | Metric | Mean ± SEM | Seeds | Best seed |",
              "|---|---|---|---:|---:|---:|"]
    for name, entry in results["tasks"].items():
        for split, metrics in entry.get("metrics", {}).items():
            for metric, stat in metrics.items():
                lines.append(f"| {name} | {split} | {metric} | {cell(stat, 2)} | {stat['n']} | {entry['best_seed']} |")
    lines += ["", "## Settings", "",
              "| Task | Init | LR | Batch | Epochs | Max steps | Warmup | WD | Layer decay | Max len | Train set |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, entry in results["tasks"].items():
        s = entry.get("settings")
        if s:
            lines.append(f"| {name} | {entry['init']} | {s['learning_rate']:g} | {s['batch_size']} | {s['epochs']:g} | "
                         f"{s['max_steps'] or '–'} | {s['warmup_ratio']:g} | {s['weight_decay']:g} | "
                         f"{s['layer_decay']:g} | {s['max_length']} | {s['max_train_samples'] or 'all'} |")
    if results["submission"]:
        lines += ["", "Test predictions (GLUE submission format) in `submission/`: "
                  + ", ".join(f"{f} ({src})" for f, src in results["submission"].items()) + "."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the whole protocol

def check_finished_runs(output_dir: Path, settings: dict[str, FineTuneSettings], seeds: int) -> None:
    for task, task_settings in settings.items():
        for seed in range(seeds):
            run = finished_run(run_dir(output_dir, task, seed))
            if run and run["settings"] and run["settings"] != dataclasses.asdict(task_settings):
                raise UsageError(f"{run_dir(output_dir, task, seed)} was made with other settings "
                                 f"({run['settings']}); use another --output-dir or delete that run")


def check_mnli_available(output_dir: Path, tasks: list[str], settings: dict[str, FineTuneSettings],
                         seeds: int) -> None:
    """AX and --from-mnli tasks need the same seed's MNLI model: from this invocation or a finished run."""
    dependents = [t for t in tasks if t == "ax" or settings[t].from_mnli]
    if not dependents or "mnli" in tasks:
        return
    missing = [s for s in range(seeds) if not (mnli_model_dir(output_dir, s) / "config.json").is_file()]
    if missing:
        raise UsageError(f"{', '.join(dependents)} need(s) the MNLI-tuned model of seeds {missing}, not found under "
                         f"{output_dir / 'runs' / 'mnli'}; add mnli to --task")


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


def load_pretrained_info(model: str) -> tuple[PreTrainedTokenizerBase, bool, bool]:
    """The checkpoint's tokenizer, whether it is base-sized, whether it takes token type ids."""
    try:
        config = AutoConfig.from_pretrained(model)
        tokenizer = AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as err:
        raise UsageError(f"could not load a model config and tokenizer from {model!r}: {err}") from err
    base_size = getattr(config, "hidden_size", 0) >= BASE_HIDDEN_SIZE
    token_types = getattr(config, "type_vocab_size", 0) > 1
    return tokenizer, base_size, token_types


def run_glue(model: str, tasks: list[str], output_dir: Path, data_dir: Path | None = None, recipe: str = "chang2021",
             seeds: int | None = None, overrides: dict | None = None, task_lr: dict[str, float] | None = None,
             from_mnli: bool = False) -> dict:
    """Fine-tune `model` on `tasks` for each seed (skipping finished runs), then aggregate everything in output_dir."""
    recipe_fields = load_recipe(recipe)
    seeds = seeds or recipe_fields["seeds"]
    task_lr = task_lr or {}
    for name in task_lr:
        get_task(name)
    check_data([get_task(t) for t in tasks], data_dir)
    tokenizer, base_size, token_types = load_pretrained_info(model)
    # AX is only predicted, with the MNLI model: it takes MNLI's settings (max length)
    settings = {t: resolve_settings(recipe_fields, "mnli" if t == "ax" else t, base_size, overrides or {}, task_lr,
                                    from_mnli) for t in tasks}
    check_finished_runs(output_dir, settings, seeds)
    check_mnli_available(output_dir, tasks, settings, seeds)

    for name in tasks:
        task = get_task(name)
        pending = [s for s in range(seeds) if finished_run(run_dir(output_dir, name, s)) is None]
        if not pending:
            print(f"[glue] {name}: all {seeds} seeds already finished, skipping")
            continue
        data = load_task_data(task, data_dir, tokenizer, settings[name], token_types)
        for seed in pending:
            path = run_dir(output_dir, name, seed)
            if path.exists():
                shutil.rmtree(path)  # an interrupted run: start it again
            print(f"[glue] {name} seed {seed}: {'predicting' if not task.trains else 'fine-tuning'}")
            if task.trains:
                source = str(mnli_model_dir(output_dir, seed)) if settings[name].from_mnli else model
                run = fine_tune(task, seed, settings[name], data, source, tokenizer, path, save_model=name == "mnli")
                print(f"[glue] {name} seed {seed}: {run['scores']}")
            else:
                predict_ax(task, seed, data, output_dir, tokenizer, path)
    return aggregate(output_dir)
