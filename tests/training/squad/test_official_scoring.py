"""SQuAD scoring against the official evaluation scripts.

Every expected number below was printed by the official scripts on these same inputs (the case tables written out
as SQuAD JSON, predictions JSON and na_prob JSON): evaluate-v1.1.py (the copy in huggingface/evaluate,
metrics/squad/compute_score.py) and evaluate-v2.0.py (the official v2.0 script, 2018), run with Python 3.11.
"""

from pathlib import Path

import pytest

from convattn.data.squad import load_squad_file, official_answers
from convattn.training.squad.metrics import (
    exact_match,
    f1_score,
    normalize_answer,
    squad_scores,
)

SQUAD_SAMPLE = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "squad" / "squad-v1.1-dev-sample.json"
needs_squad_sample = pytest.mark.skipif(
    not SQUAD_SAMPLE.is_file(), reason=f"shared SQuAD sample not found at {SQUAD_SAMPLE}"
)

# (question id, reference answers, prediction or None for a missing one)
CASES_V1 = [
    ("articles-punctuation", ["Denver Broncos"], "the Denver Broncos!"),
    ("partial", ["Saint Bernadette Soubirous"], "Bernadette"),  # P 1, R 1/3 -> F1 1/2
    ("max-over-refs", ["a golden statue of Mary", "golden statue", "Mary"], "statue of Mary"),  # 6/7 vs 2/5, 1/2
    ("case-whitespace", ["New  York\tCity"], " new york CITY "),
    ("unicode-quotes", ["\u201cHello\u201d"], "Hello"),  # curly quotes are not string.punctuation: no match
    ("ref-normalizes-empty", ["The"], "a"),  # EM 1 (both ''), yet v1.1 F1 0 (no common token)
    ("missing", ["1990"], None),
    ("dots-removed", ["U.S."], "US"),
    ("article-prefix", ["Theatre Royal"], "the Theatre"),  # 'theatre' keeps its 'the': F1 2/3
    ("repeated-tokens", ["cat cat dog"], "cat cat cat"),  # common = min counts = 2: F1 2/3
    ("hyphen-fuses", ["rock-and-roll"], "rock and roll"),  # 'rockandroll' vs 'rock and roll'
    ("unicode-case", ["Schr\u00f6dinger's cat"], "SCHR\u00d6DINGERS CAT"),
    ("unicode-space", ["Paris\u00a0France"], "Paris France"),
    ("empty-prediction", ["x"], ""),
    ("empty-vs-punctuation", ["..."], ""),  # EM 1, F1 0 in v1.1
]
EXTRA_PREDICTIONS = {"not-a-question": "ignored"}

# (question id, reference answers ([] = unanswerable), prediction, no-answer probability)
CASES_V2 = [
    ("a1", ["Denver Broncos"], "Broncos", 0.2),  # F1 2/3
    ("a2", ["1990", "in 1990"], "1990", 0.1),
    ("a3", [], "", 0.9),
    ("a4", [], "something", 0.6),
    ("a5", ["The"], "", 0.7),  # reference normalizes to '': scored as no-answer, counted as HasAns
    ("a6", ["Golden Gate Bridge"], "", 0.8),
    ("a7", [], "", 0.6),
    ("a8", ["blue whale"], "the blue whale", 0.6),
    ("a9", ["red"], "green", 0.3),
    ("a10", ["The", "Golden Gate"], "", 0.4),  # only 'Golden Gate' is a reference, so '' scores 0
    ("a11", [], "The", 0.05),  # scores as '' but, a non-empty string, costs 1 in the threshold search
]
# the same probabilities in another key order: ties at 0.6 are walked a4, a7, a8 (above) or a8, a4, a7 (here)
TIE_ORDER_V2 = ["a11", "a2", "a1", "a9", "a10", "a8", "a4", "a7", "a5", "a6", "a3"]
# logits rather than probabilities: values above the script's default threshold 1.0 turn the prediction into ''
LOGITS_V2 = {
    "a1": 3.0, "a2": -1.0, "a3": 2.5, "a4": 0.5, "a5": 1.5, "a6": 1.2, "a7": 0.0, "a8": 0.9, "a9": -2.0, "a10": 0.2,
    "a11": 0.0,
}


# --- what the official scripts printed for the inputs above ---
# evaluate-v1.1.py on CASES_V1 + EXTRA_PREDICTIONS (it warns "Unanswered question missing will receive score 0.")
EXPECTED_V1 = {"exact_match": 46.666666666666664, "f1": 51.26984126984128}
# evaluate-v1.1.py on each question of CASES_V1 alone: (exact_match, f1)
EXPECTED_V1_PER_QUESTION = {
    "articles-punctuation": (100.0, 100.0),
    "partial": (0.0, 50.0),
    "max-over-refs": (0.0, 85.71428571428571),
    "case-whitespace": (100.0, 100.0),
    "unicode-quotes": (0.0, 0.0),
    "ref-normalizes-empty": (100.0, 0.0),
    "missing": (0.0, 0.0),
    "dots-removed": (100.0, 100.0),
    "article-prefix": (0.0, 66.66666666666666),
    "repeated-tokens": (0.0, 66.66666666666666),
    "hyphen-fuses": (0.0, 0.0),
    "unicode-case": (100.0, 100.0),
    "unicode-space": (100.0, 100.0),
    "empty-prediction": (0.0, 0.0),
    "empty-vs-punctuation": (100.0, 0.0),
}
# evaluate-v2.0.py on CASES_V2, no --na-prob-file
EXPECTED_V2_DEFAULT = {
    "exact": 54.54545454545455, "f1": 60.6060606060606, "total": 11,
    "HasAns_exact": 42.857142857142854, "HasAns_f1": 52.38095238095237, "HasAns_total": 7,
    "NoAns_exact": 75.0, "NoAns_f1": 75.0, "NoAns_total": 4,
}
# evaluate-v2.0.py --na-prob-file with the CASES_V2 probabilities, keys in CASES_V2 order / in TIE_ORDER_V2 order
# (best_exact < exact: the search counts a11's "The" as an answer, the plain score as '')
EXPECTED_V2_PROBS = EXPECTED_V2_DEFAULT | {
    "best_exact": 45.45454545454545, "best_exact_thresh": 0.7, "best_f1": 51.51515151515152, "best_f1_thresh": 0.7,
}
# walking a8 before a4 reaches the best running score inside the 0.6 tie, at a threshold that really scores 4/11
EXPECTED_V2_TIE_ORDER = EXPECTED_V2_DEFAULT | {
    "best_exact": 45.45454545454545, "best_exact_thresh": 0.6, "best_f1": 51.51515151515152, "best_f1_thresh": 0.6,
}
# evaluate-v2.0.py --na-prob-file with LOGITS_V2
EXPECTED_V2_LOGITS = {
    "exact": 45.45454545454545, "f1": 45.45454545454545, "total": 11,
    "HasAns_exact": 28.571428571428573, "HasAns_f1": 28.571428571428573, "HasAns_total": 7,
    "NoAns_exact": 75.0, "NoAns_f1": 75.0, "NoAns_total": 4,
    "best_exact": 45.45454545454545, "best_exact_thresh": -1.0, "best_f1": 51.51515151515152, "best_f1_thresh": 3.0,
}
# evaluate-v1.1.py on the shared sample with its 5 repeated ids renamed <id>#<k> (as convattn.data.squad does),
# predictions = the first 5 words of each question's context. (On the file as it is the script prints
# {"exact_match": 1.7676767676767677, "f1": 11.287393071871278}: a repeated id has one prediction for two questions.)
EXPECTED_SAMPLE_FIVE_WORDS = {"exact_match": 1.7676767676767677, "f1": 11.386241726521831}


def squad_json(cases, version):
    """The case table as an official SQuAD JSON dict (the input the official scripts read)."""
    qas = [
        {"id": qid, "question": "?", "answers": [{"text": t, "answer_start": 0} for t in refs]}
        | ({"is_impossible": not refs} if version == "2.0" else {})
        for qid, refs, *_ in cases
    ]
    return {"version": version, "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]}


def v1_inputs():
    answers = {qid: refs for qid, refs, _ in CASES_V1}
    predictions = {qid: pred for qid, _, pred in CASES_V1 if pred is not None} | EXTRA_PREDICTIONS
    return answers, predictions


def v2_inputs():
    return {qid: refs for qid, refs, *_ in CASES_V2}, {qid: pred for qid, _, pred, _ in CASES_V2}


@pytest.mark.parametrize(
    "text, normalized",
    [
        ("The  Denver Broncos!", "denver broncos"),
        ("an apple, a pear", "apple pear"),
        ("theatre Anthem", "theatre anthem"),  # articles only as whole words
        ("the-end", "theend"),  # punctuation goes first, so 'the' is no longer a word
        ("(The)", ""),
        ("U.S.A.", "usa"),
        ("\u201cquoted\u201d \u2014 text", "\u201cquoted\u201d \u2014 text"),  # non-ASCII punctuation stays
        ("\u00c9COLE\u00a0Normale\u3000Sup\u00e9rieure", "\u00e9cole normale sup\u00e9rieure"),
        ("", ""),
    ],
)
def test_normalize_answer(text, normalized):
    assert normalize_answer(text) == normalized


def test_exact_match_and_f1_by_hand():
    assert exact_match("The Broncos.", "broncos") == 1.0
    assert exact_match("Broncos", "Denver Broncos") == 0.0
    assert f1_score("Denver", "Denver Broncos") == pytest.approx(2 / 3)  # P 1, R 1/2
    assert f1_score("the big red dog ran", "red dog barked") == pytest.approx(4 / 7)  # P 2/4, R 2/3
    assert f1_score("", "") == 1.0 and f1_score("the", "") == 1.0  # both empty after normalisation
    assert f1_score("", "Broncos") == 0.0 and f1_score("Broncos", "a") == 0.0


def test_v1_matches_official_script():
    answers, predictions = v1_inputs()
    # official evaluate-v1.1.py: {"exact_match": ..., "f1": ...}; total = questions in the data set
    assert squad_scores(answers, predictions, "1.1") == pytest.approx(EXPECTED_V1 | {"total": 15}, rel=1e-12)


def test_v1_per_question_matches_official_script():
    answers, predictions = v1_inputs()
    assert list(EXPECTED_V1_PER_QUESTION) == list(answers)
    for qid, (exact, f1) in EXPECTED_V1_PER_QUESTION.items():
        scores = squad_scores({qid: answers[qid]}, predictions, "1.1")
        assert scores == pytest.approx({"exact_match": exact, "f1": f1, "total": 1}, rel=1e-12), qid


def test_v2_matches_official_script_without_probabilities():
    answers, predictions = v2_inputs()
    # official evaluate-v2.0.py with no --na-prob-file
    assert squad_scores(answers, predictions, "2.0") == pytest.approx(EXPECTED_V2_DEFAULT, rel=1e-12)


def test_v2_threshold_search_matches_official_script():
    answers, predictions = v2_inputs()
    probs = {qid: p for qid, *_, p in CASES_V2}
    # official evaluate-v2.0.py --na-prob-file (the probabilities in CASES_V2 order)
    scores = squad_scores(answers, predictions, "2.0", no_answer_probs=probs)
    assert list(scores) == list(EXPECTED_V2_PROBS)  # the script's key order
    assert scores == pytest.approx(EXPECTED_V2_PROBS, rel=1e-12)


def test_v2_threshold_ties_follow_probability_order():
    answers, predictions = v2_inputs()
    probs = {qid: p for qid, *_, p in CASES_V2}
    reordered = {qid: probs[qid] for qid in TIE_ORDER_V2}
    # official evaluate-v2.0.py --na-prob-file with the keys in TIE_ORDER_V2 order
    assert squad_scores(answers, predictions, "2.0", no_answer_probs=reordered) == pytest.approx(
        EXPECTED_V2_TIE_ORDER, rel=1e-12
    )


def test_v2_scores_above_one_override_predictions():
    answers, predictions = v2_inputs()
    # official evaluate-v2.0.py --na-prob-file with LOGITS_V2 (default --na-prob-thresh 1.0)
    assert squad_scores(answers, predictions, "2.0", no_answer_probs=LOGITS_V2) == pytest.approx(
        EXPECTED_V2_LOGITS, rel=1e-12
    )


def test_v2_splits_only_when_present():
    answers = {"q": ["Paris"]}
    assert set(squad_scores(answers, {"q": "paris"}, "2.0")) == {"exact", "f1", "total", "HasAns_exact",
                                                                  "HasAns_f1", "HasAns_total"}
    assert squad_scores({"q": []}, {"q": ""}, "2.0") == {"exact": 100.0, "f1": 100.0, "total": 1,
                                                         "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 1}


def test_v2_threshold_stays_zero_when_answering_never_helps():
    answers, predictions, probs = {"n1": [], "n2": []}, {"n1": "", "n2": "x"}, {"n1": 0.3, "n2": 0.5}
    # official evaluate-v2.0.py --na-prob-file on these two unanswerable questions
    assert squad_scores(answers, predictions, "2.0", no_answer_probs=probs) == {
        "exact": 50.0, "f1": 50.0, "total": 2, "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
        "best_exact": 100.0, "best_exact_thresh": 0.0, "best_f1": 100.0, "best_f1_thresh": 0.0,
    }


def test_v2_missing_prediction_fails():
    # the official v2.0 script prints "Missing prediction for a1" and then stops with KeyError: 'a1'
    answers, predictions = v2_inputs()
    del predictions["a1"]
    with pytest.raises(ValueError, match=r"lack 1 of 11 questions.*'a1'"):
        squad_scores(answers, predictions, "2.0")
    with pytest.raises(ValueError, match=r"no_answer_probs lack 1 of 11 questions.*'a9'"):
        squad_scores(*v2_inputs(), "2.0", no_answer_probs={qid: 0.5 for qid in TIE_ORDER_V2 if qid != "a9"})


def test_bad_arguments():
    answers, predictions = v1_inputs()
    with pytest.raises(ValueError, match=r"version must be one of 1\.1, 2\.0, got '3'"):
        squad_scores(answers, predictions, "3")
    with pytest.raises(ValueError, match="answers is empty"):
        squad_scores({}, {}, "2.0")
    with pytest.raises(ValueError, match=r"version 2\.0 only"):
        squad_scores(answers, predictions, "1.1", no_answer_probs={})
    with pytest.raises(ValueError, match=r"version 1\.1 needs at least one reference.*'a3'"):
        squad_scores(*v2_inputs(), "1.1")


@needs_squad_sample
def test_shared_sample_matches_official_script():
    dev = load_squad_file(SQUAD_SAMPLE, "1.1", "dev")  # the 5 repeated ids renamed <id>#<k>
    answers = official_answers(dev)
    assert len(answers) == 396 and "573755afc3c5551400e51eb3#1" in answers  # Force reuses 5 Technical_components ids
    first_reference = {qid: refs[0] for qid, refs in answers.items()}
    assert squad_scores(answers, first_reference, "1.1") == {"exact_match": 100.0, "f1": 100.0, "total": 396}
    first_five_words = {qid: " ".join(context.split()[:5]) for qid, context in zip(dev["id"], dev["context"],
                                                                                    strict=True)}
    assert squad_scores(answers, first_five_words, "1.1") == pytest.approx(
        EXPECTED_SAMPLE_FIVE_WORDS | {"total": 396}, rel=1e-12
    )
