"""SQuAD windows and answer search against slow references of BERT's algorithm (run_squad.py's loops)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset
from helpers.tiny import tiny_wordpiece_tokenizer

from convattn.data.squad import load_squad_file, official_answers
from convattn.errors import UsageError
from convattn.training.squad.features import encode_split, max_context_flags, token_span, truncated_question
from convattn.training.squad.postprocess import best_answers, candidate_spans
from convattn.training.squad.settings import SquadSettings

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "squad"
SHARED_SAMPLE = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "squad" / "squad-v1.1-dev-sample.json"


def settings(**fields) -> SquadSettings:
    values = dict(learning_rate=1e-3, batch_size=4, epochs=1, warmup_ratio=0.1, weight_decay=0.0, layer_decay=1.0,
                  adam_epsilon=1e-6, max_length=48, doc_stride=7, max_query_length=6, n_best=20,
                  max_answer_length=30)
    return SquadSettings(**{**values, **fields})


@pytest.fixture(scope="module")
def questions() -> Dataset:
    return load_squad_file(FIXTURES / "train-v2.0.json", "2.0")


@pytest.fixture(scope="module")
def tokenizer(questions):
    return tiny_wordpiece_tokenizer(list(questions["context"]) + list(questions["question"]), vocab_size=300)


def reference_windows(n_doc: int, max_tokens_for_doc: int, doc_stride: int) -> list[tuple[int, int]]:
    """BERT run_squad.py: (start, length) of each doc span."""
    spans, start = [], 0
    while start < n_doc:
        length = min(n_doc - start, max_tokens_for_doc)
        spans.append((start, length))
        if start + length == n_doc:
            break
        start += min(length, doc_stride)
    return spans


def reference_is_max_context(spans: list[tuple[int, int]], span_index: int, position: int) -> bool:
    """BERT run_squad.py's _check_is_max_context."""
    best_score, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return span_index == best_index


@pytest.mark.parametrize("max_length,doc_stride,max_query_length", [(48, 7, 6), (40, 30, 64), (64, 128, 3),
                                                                      (33, 1, 5)])
def test_windows_match_berts_doc_spans(questions, tokenizer, max_length, doc_stride, max_query_length):
    config = settings(max_length=max_length, doc_stride=doc_stride, max_query_length=max_query_length)
    windows = encode_split(questions, tokenizer, config, token_types=True, training=False)
    by_question: dict[str, list[int]] = {}
    for row, qid in enumerate(windows["example_id"]):
        by_question.setdefault(qid, []).append(row)
    for qid, question, context in zip(questions["id"], questions["question"], questions["context"], strict=True):
        doc = tokenizer(context, add_special_tokens=False)["input_ids"]
        query = tokenizer(question, add_special_tokens=False)["input_ids"][:max_query_length]
        spans = reference_windows(len(doc), max_length - len(query) - 3, doc_stride)
        rows = by_question[qid]
        assert len(rows) == len(spans)
        for w, (row, (start, length)) in enumerate(zip(rows, spans, strict=True)):
            ids, types = windows[row]["input_ids"], windows[row]["token_type_ids"]
            assert ids == [tokenizer.cls_token_id, *query, tokenizer.sep_token_id, *doc[start:start + length],
                           tokenizer.sep_token_id]
            assert types == [0] * (len(query) + 2) + [1] * (length + 1)
            context_flags = [f for f, o in zip(windows[row]["max_context"], windows[row]["context_offsets"],
                                               strict=True) if o is not None]
            assert context_flags == [reference_is_max_context(spans, w, start + k) for k in range(length)]


def test_training_spans_cover_the_answer_or_point_at_cls(questions, tokenizer):
    windows = encode_split(questions, tokenizer, settings(), token_types=True, training=True)
    evaluation = encode_split(questions, tokenizer, settings(), token_types=True, training=False)
    contexts = dict(zip(questions["id"], questions["context"], strict=True))
    answers = dict(zip(questions["id"], questions["answers"], strict=True))
    inside = 0
    for row in range(len(windows)):
        qid, offsets = evaluation[row]["example_id"], evaluation[row]["context_offsets"]
        start, end = windows[row]["start_positions"], windows[row]["end_positions"]
        answer = answers[qid]
        if (start, end) == (0, 0):
            if answer["text"]:  # the answer must really be outside this window's context
                first = min(o[0] for o in offsets if o)
                last = max(o[1] for o in offsets if o)
                char = answer["answer_start"][0]
                assert char < first or char + len(answer["text"][0]) > last
            continue
        inside += 1
        span = contexts[qid][offsets[start][0]:offsets[end][1]]
        assert span == answer["text"][0]
    assert inside >= len([a for a in questions["answers"] if a["text"]])  # each answerable question at least once


def test_question_is_cut_to_max_query_length(tokenizer):
    question = "Where does the river Elm rise in the northern hills ?"
    cut = truncated_question(question, tokenizer, 4)
    assert tokenizer(cut, add_special_tokens=False)["input_ids"] == \
        tokenizer(question, add_special_tokens=False)["input_ids"][:4]
    assert truncated_question(question, tokenizer, 64) == question
    assert truncated_question("  " + question, tokenizer, 64) == question  # leading whitespace dropped


def test_max_context_flags_prefer_the_first_window_on_ties():
    a = [(0, 1), (2, 3), (4, 5), (6, 7)]
    # windows [0..3] and [2..5] over six tokens; token 2 and 3 have more context in one of them
    windows = [[None, *a], [None, (4, 5), (6, 7), (8, 9), (10, 11)]]
    flags = max_context_flags(windows)
    spans = [(0, 4), (2, 4)]
    assert flags[0][1:] == [reference_is_max_context(spans, 0, p) for p in range(4)]
    assert flags[1][1:] == [reference_is_max_context(spans, 1, p) for p in range(2, 6)]
    assert flags[0][0] is False


def test_max_context_flags_follow_berts_rule_on_windows_of_any_length():
    """BERT's score min(left, right) + 0.01 x window length: of two windows giving a token the same context on its
    shorter side, the longer window wins, even when it comes second."""
    def window(first: int, length: int) -> list:
        return [None, *((2 * p, 2 * p + 1) for p in range(first, first + length))]

    spans = [(0, 5), (0, 7), (3, 6)]
    flags = max_context_flags([window(*span) for span in spans])
    for index, (first, length) in enumerate(spans):
        assert flags[index][1:] == [reference_is_max_context(spans, index, p) for p in range(first, first + length)]
    assert flags[1][3] and not flags[0][3]  # token 2: context 2 on its shorter side in both, the 7-token window's


def test_an_answer_right_after_a_token_starts_at_its_own_token():
    """A token that ends where the answer begins ("$" before "100") is not the answer's first token."""
    offsets = [None, (0, 5), (6, 7), (7, 10), (11, 16), None]  # "costs $100 today"
    assert token_span(offsets, 7, 10) == (3, 3)
    assert token_span(offsets, 6, 10) == (2, 3)


def test_ends_past_the_window_take_no_place_among_the_n_best():
    """Logits of the padded positions past a window's tokens are not candidates, nor do they push real ones out."""
    offsets, flags = [None, (0, 3), (4, 7), (8, 11)], [False, True, True, True]
    start_logits = np.array([0.0, 1.0, 0.5, 0.2, 9.0, 9.0])
    end_logits = np.array([0.0, 0.1, 2.0, 0.3, 9.0, 9.0])  # positions 4 and 5: padding, highest of all
    assert candidate_spans(start_logits, end_logits, offsets, flags, 1, 30) == [(1.0, 2.0, 0, 7)]


def hand_made(contexts: dict[str, str], windows: list[tuple[str, list, list[bool]]]) -> tuple[Dataset, Dataset]:
    questions = Dataset.from_dict({"id": list(contexts), "context": list(contexts.values())})
    rows = Dataset.from_dict({"example_id": [w[0] for w in windows], "context_offsets": [w[1] for w in windows],
                              "max_context": [w[2] for w in windows]})
    return questions, rows


def test_answer_texts_are_stripped_unique_and_their_probabilities_finite():
    """Metaspace tokenizers count the space before a word in its offsets: the answer text is stripped. Two windows
    finding the same text list it once; logits in the thousands still give probabilities summing to 1."""
    context = "the cat sat on the mat"
    offsets = [None, (0, 3), (3, 7), (7, 11), (11, 14)]  # "the", " cat", " sat", " on"
    questions, windows = hand_made({"q": context}, [("q", offsets, [False, True, True, True, True]),
                                                    ("q", offsets, [False, True, True, True, True])])
    logits = np.array([0.0, 1.0, 3000.0, 2.0, 1.5])
    outputs = {"start_logits": [logits, logits], "end_logits": [logits, logits]}
    answers = best_answers(questions, windows, outputs, 3, 30, "1.1")
    assert answers.predictions["q"] == "cat"
    texts = [entry["text"] for entry in answers.nbest["q"]]
    assert texts[0] == "cat" and len(texts) == len(set(texts)) == 3
    probabilities = [entry["probability"] for entry in answers.nbest["q"]]
    assert np.isfinite(probabilities).all() and sum(probabilities) == pytest.approx(1.0)


def test_version_2_null_odds_at_the_threshold_keep_the_span_and_stay_finite_without_one():
    """BERT predicts no answer when the odds exceed the threshold, not when they equal it; a question with no valid
    span gets large finite odds (JSON has no infinity)."""
    offsets = [None, (0, 3), (4, 7)]
    questions, windows = hand_made({"q": "one two", "none": "one two"},
                                   [("q", offsets, [False, True, True]), ("none", offsets, [False, False, False])])
    start_logits = [np.array([1.0, 0.5, 0.0]), np.array([1.0, 0.5, 0.0])]
    end_logits = [np.array([1.0, 1.5, 0.0]), np.array([1.0, 1.5, 0.0])]  # span "one": 2.0, null 2.0
    answers = best_answers(questions, windows, {"start_logits": start_logits, "end_logits": end_logits}, 20, 30,
                           "2.0", null_threshold=0.0)
    assert answers.null_odds["q"] == 0.0 and answers.predictions["q"] == "one"
    assert answers.predictions["none"] == "" and np.isfinite(answers.null_odds["none"])
    json.dumps(answers.null_odds, allow_nan=False)


def reference_best_span(windows: Dataset, start_logits, end_logits, n_best: int, max_answer_length: int):
    """Every (start, end) pair of every window, no n-best shortcut: the valid one with the highest score."""
    best = (-np.inf, None)
    for row in range(len(windows)):
        offsets, flags = windows[row]["context_offsets"], windows[row]["max_context"]
        top_s = set(np.argsort(start_logits[row][:len(offsets)])[::-1][:n_best])
        top_e = set(np.argsort(end_logits[row][:len(offsets)])[::-1][:n_best])
        for s in range(len(offsets)):
            for e in range(len(offsets)):
                if s in top_s and e in top_e and offsets[s] and offsets[e] and flags[s] and s <= e < s + \
                        max_answer_length:
                    score = start_logits[row][s] + end_logits[row][e]
                    if score > best[0]:
                        best = (score, (row, s, e))
    return best


@pytest.mark.parametrize("n_best,max_answer_length", [(20, 30), (3, 2), (5, 1)])
def test_answers_are_the_best_valid_span_over_windows(questions, tokenizer, n_best, max_answer_length):
    windows = encode_split(questions, tokenizer, settings(), token_types=True, training=False)
    rng = np.random.default_rng(0)
    width = max(len(ids) for ids in windows["input_ids"])
    start_logits, end_logits = rng.normal(size=(2, len(windows), width))
    outputs = {"start_logits": list(start_logits), "end_logits": list(end_logits)}
    answers = best_answers(questions, windows, outputs, n_best, max_answer_length, "1.1")
    contexts = dict(zip(questions["id"], questions["context"], strict=True))
    for qid in questions["id"]:
        rows = [r for r, q in enumerate(windows["example_id"]) if q == qid]
        subset = windows.select(rows)
        score, where = reference_best_span(subset, start_logits[rows], end_logits[rows], n_best, max_answer_length)
        if where is None:
            assert answers.predictions[qid] == ""
            continue
        row, s, e = where
        offsets = subset[row]["context_offsets"]
        assert answers.predictions[qid] == contexts[qid][offsets[s][0]:offsets[e][1]]
        nbest = answers.nbest[qid]
        assert nbest[0]["start_logit"] + nbest[0]["end_logit"] == pytest.approx(score)
        assert len({e["text"] for e in nbest}) == len(nbest) <= n_best
        assert sum(e["probability"] for e in nbest) == pytest.approx(1.0)


def test_version_2_predicts_no_answer_when_the_null_score_wins(questions, tokenizer):
    windows = encode_split(questions, tokenizer, settings(), token_types=True, training=False)
    width = max(len(ids) for ids in windows["input_ids"])
    start_logits, end_logits = np.zeros((2, len(windows), width))
    first_qid = questions["id"][0]
    rows = [r for r, q in enumerate(windows["example_id"]) if q == first_qid]
    start_logits[:, 0] = end_logits[:, 0] = 5.0  # [CLS]: null score 10 in every window
    for row in rows:
        start_logits[row, 0] = end_logits[row, 0] = -5.0  # the first question: null score -10
    answers = best_answers(questions, windows, {"start_logits": list(start_logits), "end_logits": list(end_logits)},
                           20, 30, "2.0")
    assert answers.predictions[first_qid] != "" and answers.null_odds[first_qid] == pytest.approx(-10.0)
    for qid in questions["id"][1:]:
        assert answers.predictions[qid] == "" and answers.null_odds[qid] == pytest.approx(10.0)


# ---------------------------------------------------------------- reading the official layout

def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


@pytest.mark.parametrize("content,message", [
    ("", "empty"),
    ("not json at all", "not JSON"),
    ([1, 2], "not in the SQuAD layout"),
    ({"data": [{"title": "x", "paragraphs": [{"context": "abc def", "qas": [
        {"id": "q", "question": "?", "answers": [{"text": "def", "answer_start": 1}]}]}]}]}, "does not point at"),
    ({"data": [{"title": "x", "paragraphs": [{"context": "abc", "qas": [
        {"id": "q", "question": "?", "answers": []}]}]}]}, "no answers"),
    ({"data": []}, "no questions"),
])
def test_malformed_files_are_one_usage_error(tmp_path, content, message):
    with pytest.raises(UsageError, match=message):
        load_squad_file(write_json(tmp_path / "bad.json", content), "1.1")


def test_unanswerable_questions_need_version_2(tmp_path):
    with pytest.raises(UsageError, match=r"use `version` 2\.0"):
        load_squad_file(FIXTURES / "dev-v2.0.json", "1.1")
    dev = load_squad_file(FIXTURES / "dev-v2.0.json", "2.0")
    assert official_answers(dev)["d5"] == [] and official_answers(dev)["d1"] == ["two hundred kilometres",
                                                                                   "two hundred"]


@pytest.mark.skipif(not SHARED_SAMPLE.is_file(), reason=f"shared SQuAD sample not found at {SHARED_SAMPLE}")
def test_the_shared_sample_reads_as_a_dev_set_and_as_training_labels_without_its_misaligned_questions():
    dev = load_squad_file(SHARED_SAMPLE, "1.1", "dev")
    assert len(dev) == len(set(dev["id"])) == 396
    assert set(dev["title"]) == {"United_Methodist_Church", "Technical_components", "Force"}
    assert len(load_squad_file(SHARED_SAMPLE, "1.1", "train")) == 393  # 3 questions' answer_starts miss


@pytest.mark.parametrize("max_answer_length", [30, 2])
def test_joint_answers_are_the_best_valid_pair_in_the_beam(questions, tokenizer, max_answer_length):
    config = settings(head="joint")
    windows = encode_split(questions, tokenizer, config, token_types=True, training=False)
    rng = np.random.default_rng(1)
    rows, beam = len(windows), 5
    width = max(len(ids) for ids in windows["input_ids"])
    outputs = {"start_top_log_probs": list(-rng.random((rows, beam))),
               "start_top_index": list(rng.integers(0, width, (rows, beam))),
               "end_top_log_probs": list(-rng.random((rows, beam, beam))),
               "end_top_index": list(rng.integers(0, width, (rows, beam, beam))),
               "answerable_logits": list(rng.normal(size=rows))}
    answers = best_answers(questions, windows, outputs, 20, max_answer_length, "2.0", null_threshold=np.inf)
    contexts = dict(zip(questions["id"], questions["context"], strict=True))
    for qid in questions["id"]:
        best, text = -np.inf, ""
        for row in (r for r, q in enumerate(windows["example_id"]) if q == qid):
            offsets, flags = windows[row]["context_offsets"], windows[row]["max_context"]
            for i in range(beam):
                s = outputs["start_top_index"][row][i]
                for j in range(beam):
                    e = outputs["end_top_index"][row][i, j]
                    score = outputs["start_top_log_probs"][row][i] + outputs["end_top_log_probs"][row][i, j]
                    ok = (s < len(offsets) and e < len(offsets) and offsets[s] and offsets[e] and flags[s]
                          and s <= e < s + max_answer_length)
                    if ok and score > best:
                        best, text = score, contexts[qid][offsets[s][0]:offsets[e][1]].strip()
        assert answers.predictions[qid] == text
        # ELECTRA's no-answer odds: the lowest answerable logit over the question's windows
        expected = min(outputs["answerable_logits"][r] for r, q in enumerate(windows["example_id"]) if q == qid)
        assert answers.null_odds[qid] == pytest.approx(expected)


def test_joint_windows_carry_the_answer_mask_and_answerability(questions, tokenizer):
    config = settings(head="joint")
    train = encode_split(questions, tokenizer, config, token_types=True, training=True)
    evaluation = encode_split(questions, tokenizer, config, token_types=True, training=False)
    for row in range(len(train)):
        offsets, mask = evaluation[row]["context_offsets"], train[row]["answer_mask"]
        assert mask == [int(k == 0 or o is not None) for k, o in enumerate(offsets)]
        qid = evaluation[row]["example_id"]
        answerable = bool(questions[questions["id"].index(qid)]["answers"]["text"])
        assert train[row]["is_impossible"] == int(not answerable)


def test_repeated_ids_get_unused_names():
    from convattn.data.squad import unique_ids

    assert unique_ids(["q", "q", "q#1", "q"]) == (["q", "q#1", "q#1#1", "q#2"], 3)
