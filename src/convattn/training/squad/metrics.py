"""Exact match and F1 exactly as the official SQuAD evaluation scripts compute them (evaluate-v1.1.py and
evaluate-v2.0.py), in points.

Both normalise an answer the same way: lower case, punctuation removed, the articles a / an / the removed,
whitespace collapsed. F1 is over the normalised tokens, the maximum over the reference answers. They differ in:

* empty answers: v1.1's F1 is 0 whenever no token is shared (even "" against ""); v2.0 scores "" against ""
  as 1 and drops references that normalise to nothing (an unanswerable question has the single reference "");
* missing predictions: v1.1 counts them as 0 in its total; v2.0 cannot score them (a ValueError here);
* v2.0 also reports HasAns / NoAns splits, applies `na_prob_thresh` (a question whose no-answer probability
  exceeds it counts as answered ""), and, given no-answer probabilities, the best exact / F1 over thresholds.
"""

from __future__ import annotations

import re
import string
from collections import Counter

VERSIONS = ("1.1", "2.0")
PUNCTUATION = frozenset(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    text = "".join(char for char in text.lower() if char not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1_score(prediction: str, truth: str) -> float:
    """v2.0's token F1 (an empty answer matches only an empty answer)."""
    predicted, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not predicted or not gold:
        return float(predicted == gold)
    return _overlap_f1(predicted, gold)


def _overlap_f1(predicted: list[str], gold: list[str]) -> float:
    same = sum((Counter(predicted) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def _f1_v1(prediction: str, truth: str) -> float:
    return _overlap_f1(normalize_answer(prediction).split(), normalize_answer(truth).split())


def _scores_v1(answers: dict[str, list[str]], predictions: dict[str, str]) -> dict[str, float]:
    exact = f1 = 0.0
    for qid, truths in answers.items():
        if qid in predictions:  # an unanswered question scores 0 but counts in the total
            exact += max(exact_match(predictions[qid], t) for t in truths)
            f1 += max(_f1_v1(predictions[qid], t) for t in truths)
    return {"exact_match": 100 * exact / len(answers), "f1": 100 * f1 / len(answers), "total": len(answers)}


def _best_threshold(predictions: dict[str, str], scores: dict[str, float], no_answer_probs: dict[str, float],
                    has_answer: dict[str, bool]) -> tuple[float, float]:
    """The official find_best_thresh: walk the questions by rising no-answer probability, answering each one
    (instead of abstaining) in turn; the best running score and the probability where it was reached."""
    score = best = sum(not has for has in has_answer.values())
    threshold = 0.0
    for qid in sorted(no_answer_probs, key=lambda q: no_answer_probs[q]):
        if qid not in scores:
            continue
        score += scores[qid] if has_answer[qid] else (-1 if predictions[qid] else 0)
        if score > best:
            best, threshold = score, no_answer_probs[qid]
    return 100 * best / len(scores), threshold


def _scores_v2(answers: dict[str, list[str]], predictions: dict[str, str],
               no_answer_probs: dict[str, float] | None, na_prob_thresh: float) -> dict[str, float]:
    has_answer = {qid: bool(truths) for qid, truths in answers.items()}
    # the official script leaves a missing prediction out of `total`, then fails (KeyError) on its splits
    _check_covered("predictions", predictions, answers)
    if no_answer_probs is not None:
        _check_covered("no_answer_probs", no_answer_probs, answers)
    exact_raw, f1_raw = {}, {}
    for qid, truths in answers.items():
        truths = [t for t in truths if normalize_answer(t)] or [""]
        exact_raw[qid] = max(exact_match(predictions[qid], t) for t in truths)
        f1_raw[qid] = max(f1_score(predictions[qid], t) for t in truths)
    probs = no_answer_probs if no_answer_probs is not None else dict.fromkeys(predictions, 0.0)

    def thresholded(raw: dict[str, float]) -> dict[str, float]:
        return {qid: float(not has_answer[qid]) if probs[qid] > na_prob_thresh else s for qid, s in raw.items()}

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)
    result = {"exact": 100 * sum(exact.values()) / len(exact), "f1": 100 * sum(f1.values()) / len(f1),
              "total": len(exact)}
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, has in has_answer.items() if has == wanted]
        if qids:
            result[f"{prefix}_exact"] = 100 * sum(exact[q] for q in qids) / len(qids)
            result[f"{prefix}_f1"] = 100 * sum(f1[q] for q in qids) / len(qids)
            result[f"{prefix}_total"] = len(qids)
    if no_answer_probs is not None:
        result["best_exact"], result["best_exact_thresh"] = _best_threshold(predictions, exact_raw, probs,
                                                                            has_answer)
        result["best_f1"], result["best_f1_thresh"] = _best_threshold(predictions, f1_raw, probs, has_answer)
    return result


def _check_covered(name: str, values: dict, answers: dict) -> None:
    if missing := [qid for qid in answers if qid not in values]:
        raise ValueError(f"{name} lack {len(missing)} of {len(answers)} questions (SQuAD 2.0 scores every "
                         f"question), e.g. {missing[:5]}")


def squad_scores(answers: dict[str, list[str]], predictions: dict[str, str], version: str,
                 no_answer_probs: dict[str, float] | None = None, na_prob_thresh: float = 1.0) -> dict[str, float]:
    """The official evaluation's output for `version` ("1.1" or "2.0"). answers: question id -> reference texts
    ([] for an unanswerable v2.0 question); predictions: question id -> answer ("" = no answer)."""
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {', '.join(VERSIONS)}, got {version!r}")
    if not answers:
        raise ValueError("answers is empty: there is no question to score")
    if version == "1.1":
        if no_answer_probs is not None:
            raise ValueError("no_answer_probs are for version 2.0 only")
        if unanswerable := [qid for qid, truths in answers.items() if not truths]:
            raise ValueError(f"version 1.1 needs at least one reference answer per question; none for "
                             f"{unanswerable[:5]}")
        return _scores_v1(answers, predictions)
    return _scores_v2(answers, predictions, no_answer_probs, na_prob_thresh)
