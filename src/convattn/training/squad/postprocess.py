"""The model's outputs for every window -> one answer per question (BERT's and ELECTRA's n-best search).

Span head: the `n_best` highest start and end logits of each window give candidate spans, scored start + end
logit. Joint head (ELECTRA): each of the beam's starts with each of its beam of ends, scored start + end
log-probability. A candidate must lie in the context, start where the window has the token's maximum context,
end at or after its start and be at most `max_answer_length` tokens long. Candidates of all windows are ranked
by score; their text is the context's characters from the first token's start to the last token's end.

SQuAD 2.0 also scores "no answer" as `null_odds`, what the official v2.0 evaluator takes as the no-answer
probability when it searches the threshold: span head, the lowest start[CLS] + end[CLS] over the windows minus
the best span's score (BERT); joint head, the lowest answerable ("no answer") logit over the windows (ELECTRA).
The prediction is "" when the odds exceed `null_threshold`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from datasets import Dataset


@dataclass
class Answers:
    predictions: dict[str, str]          # question id -> answer text ("" = no answer)
    nbest: dict[str, list[dict]]         # question id -> [{text, probability, start_logit, end_logit}, ...]
    null_odds: dict[str, float]          # SQuAD 2.0: question id -> null score - best span score


def valid_span(s: int, e: int, offsets: list, max_context: list[bool], max_answer_length: int) -> bool:
    return (s < len(offsets) and e < len(offsets) and offsets[s] is not None and offsets[e] is not None
            and max_context[s] and s <= e < s + max_answer_length)


def candidate_spans(start_logits: np.ndarray, end_logits: np.ndarray, offsets: list, max_context: list[bool],
                    n_best: int, max_answer_length: int) -> list[tuple[float, float, int, int]]:
    """Span head: (start logit, end logit, start char, end char) of every valid span among the n-best starts and
    ends of one window."""
    length = len(offsets)
    starts = np.argsort(start_logits[:length])[::-1][:n_best]
    ends = np.argsort(end_logits[:length])[::-1][:n_best]
    return [(float(start_logits[s]), float(end_logits[e]), offsets[s][0], offsets[e][1])
            for s in starts for e in ends if valid_span(s, e, offsets, max_context, max_answer_length)]


def joint_candidate_spans(start_log_probs: np.ndarray, start_index: np.ndarray, end_log_probs: np.ndarray,
                          end_index: np.ndarray, offsets: list, max_context: list[bool],
                          max_answer_length: int) -> list[tuple[float, float, int, int]]:
    """Joint head: (start log-prob, end log-prob, start char, end char) of every valid (start, end) in the beam."""
    spans = []
    for i, s in enumerate(start_index.astype(int)):
        for j, e in enumerate(end_index[i].astype(int)):
            if valid_span(s, e, offsets, max_context, max_answer_length):
                spans.append((float(start_log_probs[i]), float(end_log_probs[i, j]), offsets[s][0], offsets[e][1]))
    return spans


def softmax(scores: list[float]) -> list[float]:
    exp = np.exp(np.asarray(scores) - max(scores))
    return (exp / exp.sum()).tolist()


def best_answers(questions: Dataset, windows: Dataset, outputs: dict[str, list[np.ndarray]], n_best: int,
                 max_answer_length: int, version: str, null_threshold: float = 0.0) -> Answers:
    """`questions` (id, context) and their `windows` (example_id, context_offsets, max_context) with the model's
    outputs per window (span head: start_logits, end_logits; joint head: start_top_log_probs, start_top_index,
    end_top_log_probs, end_top_index, answerable_logits) -> the answers, their n-best lists and (v2.0) null odds."""
    joint = "start_top_index" in outputs
    by_question = defaultdict(list)
    for row, question_id in enumerate(windows["example_id"]):
        by_question[question_id].append(row)
    offsets_column, context_column = windows["context_offsets"], windows["max_context"]
    answers = Answers({}, {}, {})
    for question_id, context in zip(questions["id"], questions["context"], strict=True):
        spans, null_score = [], np.inf
        for row in by_question[question_id]:
            if joint:
                spans += joint_candidate_spans(
                    outputs["start_top_log_probs"][row], outputs["start_top_index"][row],
                    outputs["end_top_log_probs"][row], outputs["end_top_index"][row], offsets_column[row],
                    context_column[row], max_answer_length)
                null_score = min(null_score, float(outputs["answerable_logits"][row]))
            else:
                start_logits, end_logits = outputs["start_logits"][row], outputs["end_logits"][row]
                spans += candidate_spans(start_logits, end_logits, offsets_column[row], context_column[row], n_best,
                                         max_answer_length)
                null_score = min(null_score, float(start_logits[0] + end_logits[0]))
        spans.sort(key=lambda span: span[0] + span[1], reverse=True)
        nbest, seen = [], set()
        for start_logit, end_logit, start_char, end_char in spans:
            text = context[start_char:end_char].strip()  # metaspace tokenizers count the space before a word
            if text in seen:
                continue
            seen.add(text)
            nbest.append({"text": text, "start_logit": start_logit, "end_logit": end_logit})
            if len(nbest) == n_best:
                break
        if nbest:
            for entry, probability in zip(nbest, softmax([e["start_logit"] + e["end_logit"] for e in nbest]),
                                          strict=True):
                entry["probability"] = probability
        best = nbest[0]["text"] if nbest else ""
        if version == "2.0":
            best_score = nbest[0]["start_logit"] + nbest[0]["end_logit"] if nbest else -np.inf
            answers.null_odds[question_id] = null_score if joint else float(min(null_score - best_score, 1e9))
            best = "" if answers.null_odds[question_id] > null_threshold else best
        answers.predictions[question_id] = best
        answers.nbest[question_id] = nbest
    return answers
