"""The GLUE tasks: what each one reads, predicts and is scored on, and loaders for its splits.

Splits come from a local `glue_data` directory in the standard TSV layout (the one written by the
GLUE download script) or from the HF hub (`nyu-mll/glue`). Either way a split becomes a
`datasets.Dataset` with columns `text_a`, [`text_b`], `idx` and, for labelled splits, `label`
(the index into `GlueTask.labels`, or a float for STS-B).
"""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset

from convattn.data.hub_access import load_hub_dataset
from convattn.errors import UsageError, option

HUB_DATASET = "nyu-mll/glue"

# the table layout of Chang et al. (2021), Table 6; the GLUE score averages these columns (WNLI left out)
GLUE_COLUMNS = ("CoLA", "MNLI-m", "MNLI-mm", "MRPC", "QNLI", "QQP", "RTE", "SST", "STS")

# local split name -> split name on the hub
HUB_SPLITS = {
    "train": "train", "dev": "validation", "test": "test",
    "dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched",
    "test_matched": "test_matched", "test_mismatched": "test_mismatched",
}

csv.field_size_limit(sys.maxsize)  # a few GLUE sentences are longer than csv's default field limit


@dataclass(frozen=True)
class GlueTask:
    name: str                         # the hub config name: cola, sst2, ..., ax
    folder: str                       # its folder in glue_data
    hub_text_columns: tuple[str, ...]
    tsv_text_columns: tuple[str, ...]
    tsv_label_column: str | None
    labels: tuple[str, ...]           # label strings as in the TSV files and the submission; () = regression
    metrics: tuple[str, ...]
    dev_columns: dict[str, str] = field(default_factory=dict)   # dev split -> table column
    test_files: dict[str, str] = field(default_factory=dict)    # test split -> submission file name
    headerless_columns: tuple[str, ...] = ()  # CoLA's train/dev files have no header row
    label_names: tuple[str, ...] = ()  # what each label means (the hub dataset's class names); () = `labels`

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        return len(self.labels) or 1

    @property
    def id2label(self) -> dict[int, str]:
        """Class index -> class name, as a fine-tuned model's config carries them (what a pipeline returns)."""
        return dict(enumerate(self.label_names or self.labels or ("score",)))

    @property
    def label2id(self) -> dict[str, int]:
        return {name: index for index, name in self.id2label.items()}

    @property
    def trains(self) -> bool:
        """False for AX, which is only predicted (with the MNLI model)."""
        return bool(self.dev_columns)

    def tsv_path(self, data_dir: Path, split: str) -> Path:
        if self.name == "ax":
            return data_dir / self.folder / "diagnostic.tsv"
        return data_dir / self.folder / f"{split}.tsv"


BINARY = ("0", "1")
NLI2 = ("entailment", "not_entailment")

TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("cola", "CoLA", ("sentence",), ("sentence",), "label", BINARY, ("mcc",),
             {"dev": "CoLA"}, {"test": "CoLA.tsv"},
             headerless_columns=("source", "label", "author_label", "sentence"),
             label_names=("unacceptable", "acceptable")),
    GlueTask("sst2", "SST-2", ("sentence",), ("sentence",), "label", BINARY, ("accuracy",),
             {"dev": "SST"}, {"test": "SST-2.tsv"}, label_names=("negative", "positive")),
    GlueTask("mrpc", "MRPC", ("sentence1", "sentence2"), ("#1 String", "#2 String"), "Quality", BINARY,
             ("accuracy", "f1"), {"dev": "MRPC"}, {"test": "MRPC.tsv"}, label_names=("not_equivalent", "equivalent")),
    GlueTask("stsb", "STS-B", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "score", (),
             ("pearson", "spearman"), {"dev": "STS"}, {"test": "STS-B.tsv"}),
    GlueTask("qqp", "QQP", ("question1", "question2"), ("question1", "question2"), "is_duplicate", BINARY,
             ("accuracy", "f1"), {"dev": "QQP"}, {"test": "QQP.tsv"}, label_names=("not_duplicate", "duplicate")),
    GlueTask("mnli", "MNLI", ("premise", "hypothesis"), ("sentence1", "sentence2"), "gold_label",
             ("entailment", "neutral", "contradiction"), ("accuracy",),
             {"dev_matched": "MNLI-m", "dev_mismatched": "MNLI-mm"},
             {"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}),
    GlueTask("qnli", "QNLI", ("question", "sentence"), ("question", "sentence"), "label", NLI2, ("accuracy",),
             {"dev": "QNLI"}, {"test": "QNLI.tsv"}),
    GlueTask("rte", "RTE", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label", NLI2, ("accuracy",),
             {"dev": "RTE"}, {"test": "RTE.tsv"}),
    GlueTask("wnli", "WNLI", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label", BINARY,
             ("accuracy",), {"dev": "WNLI"}, {"test": "WNLI.tsv"}, label_names=("not_entailment", "entailment")),
    GlueTask("ax", "diagnostic", ("premise", "hypothesis"), ("sentence1", "sentence2"), None,
             ("entailment", "neutral", "contradiction"), (), {}, {"test": "AX.tsv"}),
)}


def get_task(name: str) -> GlueTask:
    if name not in TASKS:
        raise UsageError(f"unknown GLUE task {name!r}; tasks are {' '.join(TASKS)} (or 'all')")
    return TASKS[name]


def parse_task_list(spec: str) -> list[str]:
    """'all' or a comma list -> task names in registry order (MNLI before the tasks that build on it)."""
    names = set(TASKS) if spec.strip() == "all" else {s.strip().lower() for s in spec.split(",") if s.strip()}
    if not names:
        raise UsageError(f"{option('task')} is empty; give task names separated by commas, or 'all'")
    for name in names:
        get_task(name)
    order = ("mnli", *[n for n in TASKS if n != "mnli"])
    return [n for n in order if n in names]


def read_tsv(path: Path, fieldnames: tuple[str, ...] | None = None) -> list[dict[str, str]]:
    """Rows of a GLUE TSV file (no quoting: GLUE sentences contain bare quote characters)."""
    reader = csv.DictReader(io.StringIO(read_utf8(path), newline=""), fieldnames=fieldnames, delimiter="\t",
                            quoting=csv.QUOTE_NONE)
    return list(reader)


def read_utf8(path: Path) -> str:
    """A file's text (utf-8-sig: MRPC starts with a BOM); one line naming the file and line that is not UTF-8."""
    data = path.read_bytes()
    from convattn.data.corpus import looks_like_utf16

    if looks_like_utf16(data[:4096]):
        raise UsageError(f"{path}: UTF-16 text, not UTF-8; GLUE files are UTF-8: convert it, e.g. iconv -f UTF-16 -t "
                         f"UTF-8 {path.name} > {path.stem}.utf8{path.suffix}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise UsageError(f"{path}:{line}: not UTF-8 (byte {data[err.start]:#04x}); GLUE files are UTF-8: convert it, "
                         f"e.g. iconv -f latin1 -t utf-8 {path.name}") from None


# the range of a regression task's scores (STS-B: similarity from 0 to 5)
SCORE_RANGE = (0.0, 5.0)


def _label_value(task: GlueTask, raw: str | None, where: str) -> int | float:
    if task.is_regression:
        low, high = SCORE_RANGE
        try:
            score = float(raw)
        except ValueError:
            score = None
        if score is None or not low <= score <= high:  # NaN fails the comparison too
            raise ValueError(f"{where}: {task.name} {task.tsv_label_column} {raw!r} is not a number from {low:g} to "
                             f"{high:g}")
        return score
    if raw not in task.labels:
        raise ValueError(f"{where}: unknown {task.name} label {raw!r} (expected one of {', '.join(task.labels)})")
    return task.labels.index(raw)


def load_tsv_split(task: GlueTask, split: str, data_dir: Path) -> Dataset:
    path = task.tsv_path(data_dir, split)
    if not path.is_file():
        raise FileNotFoundError(f"no {task.name} {split} data: {path} does not exist "
                                f"(--data-dir should be a glue_data directory with a {task.folder}/ folder)")
    labelled = not split.startswith("test") and task.tsv_label_column is not None
    headerless = labelled and bool(task.headerless_columns)
    rows = read_tsv(path, task.headerless_columns if headerless else None)
    first_line = 1 if headerless else 2
    if not rows:
        raise ValueError(f"{path} has no data rows; give the {task.name} {split} file in the GLUE TSV layout")
    columns: dict[str, list] = {"text_a": [], "text_b": [], "idx": [], "label": []}
    needed = (*task.tsv_text_columns, *([task.tsv_label_column] if labelled else []))
    seen: dict[int, int] = {}  # index -> its line
    for line, row in enumerate(rows):
        where = f"{path}:{line + first_line}"
        if None in row or None in row.values():  # DictReader's marks of extra or missing fields
            expected = len(row) - (None in row)
            found = sum(value is not None for key, value in row.items() if key is not None) + len(row.get(None) or ())
            raise ValueError(f"{where}: {found} tab-separated columns, expected {expected} "
                             f"({', '.join(k for k in row if k is not None)})")
        if any(row.get(c) is None for c in needed):
            raise ValueError(f"{where}: malformed row, expected the columns {', '.join(needed)}")
        if not any(row[column].strip() for column in task.tsv_text_columns):
            texts = " and ".join(task.tsv_text_columns)
            raise ValueError(f"{where}: the {texts} {'is' if len(task.tsv_text_columns) == 1 else 'are'} empty, so "
                             "there is nothing to classify; remove the row or fill it in")
        columns["text_a"].append(row[task.tsv_text_columns[0]])
        if len(task.tsv_text_columns) > 1:
            columns["text_b"].append(row[task.tsv_text_columns[1]])
        index = row.get("index") or row.get("id") or line
        try:
            index = int(index)
        except ValueError:
            raise ValueError(f"{where}: index {index!r} is not a whole number") from None
        if not labelled and index in seen:  # a test file: each index is one row of the submission
            raise ValueError(f"{where}: index {index} is given twice (first at {path}:{seen[index]}); each test row "
                             "needs its own index")
        seen[index] = line + first_line
        columns["idx"].append(index)
        if labelled:
            columns["label"].append(_label_value(task, row[task.tsv_label_column], where))
    return Dataset.from_dict({k: v for k, v in columns.items() if v or (k == "label" and labelled)})


def load_hub_split(task: GlueTask, split: str) -> Dataset:

    try:
        dataset = load_hub_dataset(HUB_DATASET, task.name, split=HUB_SPLITS[split])
    except Exception as err:  # offline, not cached, hub errors: all mean the same to the user
        raise UsageError(f"could not load {HUB_DATASET} ({task.name}, {HUB_SPLITS[split]}) from the HF hub "
                         f"({type(err).__name__}); pass {option('data_dir')} GLUE_DIR with the GLUE TSV files") from err
    renames = dict(zip(task.hub_text_columns, ("text_a", "text_b"), strict=False))
    dataset = dataset.rename_columns(renames)
    if split.startswith("test") or task.name == "ax":
        dataset = dataset.remove_columns("label")  # test labels on the hub are all -1
    return dataset.select_columns([c for c in ("text_a", "text_b", "idx", "label") if c in dataset.column_names])


def load_split(task: GlueTask, split: str, data_dir: Path | None) -> Dataset:
    """One split of one task, from `data_dir` (GLUE TSV layout) or, when it is None, from the HF hub."""
    return load_tsv_split(task, split, data_dir) if data_dir is not None else load_hub_split(task, split)


def has_split(task: GlueTask, split: str, data_dir: Path | None) -> bool:
    return data_dir is None or task.tsv_path(data_dir, split).is_file()
