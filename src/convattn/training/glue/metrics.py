"""GLUE metrics (in points, 0-100, as in the papers) and the submission format of test predictions."""

from __future__ import annotations

import numpy as np
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from convattn.data.glue import GlueTask


def score_predictions(task: GlueTask, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Predicted class ids (or STS-B scores) against gold labels -> the task's metrics x 100."""
    compute = {
        "accuracy": lambda: accuracy_score(labels, predictions),
        "f1": lambda: f1_score(labels, predictions),
        "mcc": lambda: matthews_corrcoef(labels, predictions),
        "pearson": lambda: correlation(stats.pearsonr, predictions, labels),
        "spearman": lambda: correlation(stats.spearmanr, predictions, labels),
    }
    return {name: 100 * float(compute[name]()) for name in task.metrics}


def correlation(statistic, predictions: np.ndarray, labels: np.ndarray) -> float:
    """A correlation coefficient, 0 where it is undefined (scipy's NaN: a side with one value, such as a collapsed
    model's constant prediction, which `constant_prediction_warning` says): a score is always a number."""
    if np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0
    return statistic(predictions, labels).statistic


def one_class_warning(task: GlueTask, split: str, predictions: np.ndarray) -> str | None:
    """The warning for a classifier that gives every dev example the same class (a collapsed model: its accuracy
    is that class's share, its MCC 0), else None."""
    classes = np.unique(predictions)
    if task.is_regression or len(classes) != 1:
        return None
    return (f"{split}: predicts {task.id2label[int(classes[0])]!r} for every one of the {len(predictions):,} dev "
            "examples (the score is that class's share); fine-tune longer or with another learning rate")


def constant_prediction_warning(task: GlueTask, split: str, predictions: np.ndarray) -> str | None:
    """The warning for a regression model (STS-B) that gives every dev example the same score (its correlations
    are undefined, scored 0), else None."""
    if not task.is_regression or len(predictions) == 0 or np.ptp(predictions) != 0:
        return None
    return (f"{split}: predicts {float(predictions[0]):.3f} for every one of the {len(predictions):,} dev examples "
            "(its correlations are undefined and scored 0); fine-tune longer or with another learning rate")


def logits_to_predictions(task: GlueTask, logits: np.ndarray) -> np.ndarray:
    return logits.reshape(-1) if task.is_regression else logits.argmax(-1)


def column_score(metrics: dict[str, float]) -> float:
    """A table cell: the mean of the split's metrics (MRPC/QQP accuracy and F1, STS-B Pearson and Spearman)."""
    return float(np.mean(list(metrics.values())))


def submission_text(task: GlueTask, predictions: np.ndarray, indices: list[int]) -> str:
    """GLUE submission format: `index<TAB>prediction`, label strings (0/1 for binary tasks), STS-B clipped to 0..5."""
    if task.is_regression:
        values = [f"{min(max(float(p), 0.0), 5.0):.3f}" for p in predictions]
    else:
        values = [task.labels[int(p)] for p in predictions]
    return "index\tprediction\n" + "".join(f"{i}\t{v}\n" for i, v in zip(indices, values, strict=True))
