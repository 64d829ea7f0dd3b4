"""convattn's SQuAD scores against the official evaluation scripts' output on the same predictions.

The expected numbers were produced by running the official evaluate-v1.1.py and evaluate-v2.0.py (the SQuAD
site's scripts, as copied in BERT's and allenai/bi-att-flow's repositories) on these hand-written
questions and predictions, and on the shared sample; they are not recomputed here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from convattn.data.squad import load_squad_file, official_answers
from convattn.training.squad.metrics import exact_match, f1_score, normalize_answer, squad_scores

SHARED_SAMPLE = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "squad" / "squad-v1.1-dev-sample.json"

ANSWERS = {
    "q1": ["The Eiffel Tower", "Eiffel Tower"],      # punctuation and case: exact
    "q2": ["1968"],                                  # a longer prediction: partial F1
    "q3": ["a dog and a cat"],                       # articles dropped, order matters for EM only
    "q4": ["Marie Skłodowska–Curie"],                # an en dash is not string.punctuation; "-" is
    "q5": ["the"],                                   # a reference that normalises to nothing
    "q6": ["missing"],                               # no prediction
    "q7": ["  multiple   spaces here "],             # whitespace
    "q10": ["Paris"],                                # an empty prediction of an answerable question
    "q11": ["Dr. Smith's lab", "Smith lab"],         # max over references
}
PREDICTIONS = {"q1": "eiffel tower!", "q2": "in 1968", "q3": "the cat and dog", "q4": "Marie Skłodowska-Curie",
               "q5": "The", "q7": "multiple spaces here", "q10": "", "q11": "the lab of Dr Smith"}
# SQuAD 2.0: two unanswerable questions, q6 left out (the official v2.0 script fails on a missing prediction)
ANSWERS_V2 = {**{k: v for k, v in ANSWERS.items() if k != "q6"}, "q8": [], "q9": []}
PREDICTIONS_V2 = {**PREDICTIONS, "q8": "", "q9": "something"}
NO_ANSWER_PROBS = {"q1": 0.1, "q2": 0.5, "q3": 0.5, "q4": 0.3, "q5": 0.05, "q7": 0.2, "q10": 0.7, "q11": 0.4,
                   "q8": 0.9, "q9": 1.5}  # q9 above the default na_prob_thresh 1.0; q2 and q3 tie


def test_version_1_1_matches_the_official_script():
    scores = squad_scores(ANSWERS, PREDICTIONS, "1.1")
    # evaluate-v1.1.py: {"exact_match": 33.333333333333336, "f1": 53.7037037037037}
    assert scores["exact_match"] == pytest.approx(33.333333333333336, rel=1e-12)
    assert scores["f1"] == pytest.approx(53.7037037037037, rel=1e-12)
    assert scores["total"] == 9


def test_version_2_0_matches_the_official_script_without_no_answer_probabilities():
    # evaluate-v2.0.py data.json pred.json
    expected = {"exact": 40.0, "f1": 68.33333333333333, "total": 10, "HasAns_exact": 37.5,
                "HasAns_f1": 72.91666666666666, "HasAns_total": 8, "NoAns_exact": 50.0, "NoAns_f1": 50.0,
                "NoAns_total": 2}
    scores = squad_scores(ANSWERS_V2, PREDICTIONS_V2, "2.0")
    assert scores.keys() == expected.keys()
    assert scores == pytest.approx(expected, rel=1e-12)


def test_version_2_0_matches_the_official_script_with_no_answer_probabilities():
    # evaluate-v2.0.py data.json pred.json --na-prob-file na.json
    expected = {"exact": 50.0, "f1": 78.33333333333333, "total": 10, "HasAns_exact": 37.5,
                "HasAns_f1": 72.91666666666666, "HasAns_total": 8, "NoAns_exact": 100.0, "NoAns_f1": 100.0,
                "NoAns_total": 2, "best_exact": 50.0, "best_exact_thresh": 0.2, "best_f1": 78.33333333333334,
                "best_f1_thresh": 0.5}
    scores = squad_scores(ANSWERS_V2, PREDICTIONS_V2, "2.0", no_answer_probs=NO_ANSWER_PROBS)
    assert scores.keys() == expected.keys()
    assert scores == pytest.approx(expected, rel=1e-12)


def test_a_no_answer_probability_at_the_threshold_keeps_the_prediction():
    """The official v2.0 script abstains where the probability exceeds na_prob_thresh, not where it equals it."""
    scores = squad_scores({"a": ["Paris"], "b": []}, {"a": "Paris", "b": ""}, "2.0",
                          no_answer_probs={"a": 0.5, "b": 0.5}, na_prob_thresh=0.5)
    assert scores["exact"] == scores["f1"] == 100.0


def test_the_two_scripts_differ_on_empty_answers():
    assert normalize_answer("The  (Eiffel) tower!") == "eiffel tower"
    assert normalize_answer("an") == "" and exact_match("The", "a") == 1.0
    assert f1_score("", "") == 1.0 and f1_score("", "Paris") == 0.0  # v2.0
    assert squad_scores({"q": ["the"]}, {"q": "the"}, "1.1")["f1"] == 0.0  # v1.1: no shared token, 0
    assert squad_scores({"q": ["the"]}, {"q": "the"}, "2.0")["f1"] == 100.0


def test_bad_version_and_missing_v2_predictions_are_value_errors():
    with pytest.raises(ValueError, match=r"version must be one of 1\.1, 2\.0"):
        squad_scores(ANSWERS, PREDICTIONS, "3")
    with pytest.raises(ValueError, match="q6"):
        squad_scores({**ANSWERS_V2, "q6": ["x"]}, PREDICTIONS_V2, "2.0")


@pytest.mark.skipif(not SHARED_SAMPLE.is_file(), reason=f"shared SQuAD sample not found at {SHARED_SAMPLE}")
def test_the_shared_sample_against_the_official_script():
    dev = load_squad_file(SHARED_SAMPLE, "1.1", "dev")  # 5 repeated ids renamed <id>#1, as in the official run
    answers = official_answers(dev)
    first = {qid: refs[0] for qid, refs in answers.items()}
    assert squad_scores(answers, first, "1.1") == {"exact_match": 100.0, "f1": 100.0, "total": 396}
    five_words = {qid: " ".join(context.split()[:5]) for qid, context in zip(dev["id"], dev["context"], strict=True)}
    scores = squad_scores(answers, five_words, "1.1")
    # evaluate-v1.1.py on the sample with the same renamed ids
    assert scores["exact_match"] == pytest.approx(1.7676767676767677, rel=1e-12)
    assert scores["f1"] == pytest.approx(11.386241726521831, rel=1e-12)


def test_the_results_say_when_seeds_were_fine_tuned_by_different_code(tmp_path):
    import json

    from convattn.training.squad.results import aggregate

    for seed, code in ((0, "aaa"), (1, "bbb"), (2, "aaa")):
        folder = tmp_path / "runs" / "squad1.1" / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({
            "version": "1.1", "seed": seed, "model": "m", "settings": None, "encoder_params": 10,
            "scores": {"exact_match": 50.0 + seed, "f1": 60.0 + seed}, "convattn_source": code}))
    results = aggregate(tmp_path, "1.1")
    assert results["scores"]["f1"]["mean"] == pytest.approx(61.0)
    assert len(results["warnings"]) == 1 and "(code aaa: seed 0, seed 2; code bbb: seed 1)" in results["warnings"][0]
    assert "## Warnings\n\n- these results put together runs" in (tmp_path / "squad_results.md").read_text()
    (tmp_path / "runs" / "squad1.1" / "seed1" / "run.json").unlink()
    assert aggregate(tmp_path, "1.1")["warnings"] == []
