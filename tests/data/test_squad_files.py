"""SQuAD files that are not what --version says, or not in the official layout, are one UsageError naming the
place; contexts past the stated limit are refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from convattn.data.squad import MAX_CONTEXT_CHARACTERS, load_squad_file, read_squad_json
from convattn.errors import UsageError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "squad"
SHARED_SAMPLE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "squad" / \
    "squad-v1.1-dev-sample.json"


def squad_file(tmp_path: Path, qa: dict | None = None, *, version: str | None = "1.1", paragraphs=None,
               context: str = "one two three") -> Path:
    question = {"id": "q1", "question": "which?", "answers": [{"text": "two", "answer_start": 4}]}
    if qa is not None:
        question = qa
    if paragraphs is None:
        paragraphs = [{"context": context, "qas": [question]}]
    data = {"data": [{"title": "t", "paragraphs": paragraphs}]}
    if version is not None:
        data["version"] = version
    path = tmp_path / "train.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("build", "message"), [
    (lambda d: squad_file(d, {"id": "q1", "question": "which?"}), "no \"answers\" list"),
    (lambda d: squad_file(d, {"id": "q1", "question": "which?", "answers": None}), "\"answers\" must be a list"),
    (lambda d: squad_file(d, {"id": "q1", "question": "which?", "answers": ["two"]}),
     "every answer needs a string \"text\""),
    (lambda d: squad_file(d, {"id": "q1", "question": "which?", "answers": [{"text": "two", "answer_start": True}]}),
     "integer \"answer_start\""),
    (lambda d: squad_file(d, {"id": "q1", "question": "which?", "is_impossible": "no", "answers": []}),
     "\"is_impossible\" must be true or false"),
    (lambda d: squad_file(d, paragraphs="a string, not a list"), "article 0 must be an object with a \"paragraphs\""),
    (lambda d: squad_file(d, paragraphs=["a string"]), "article 0, paragraph 0: needs a \"context\" string"),
    (lambda d: squad_file(d, paragraphs=[{"context": "c", "qas": ["q"]}]), "must be a question object"),
    (lambda d: squad_file(d, version="v2.0"), "is a SQuAD 2.0 file (its \"version\" is 'v2.0'); use `version` 2.0"),
    (lambda d: squad_file(d, version="3.0"), "its \"version\" is '3.0', which convattn does not read; SQuAD files "
                                             "say \"1.1\" or \"v2.0\" (the versions of `version`: 1.1, 2.0)"),
    (lambda d: squad_file(d, version=["1.1"]), "its \"version\" is ['1.1'], which convattn does not read"),
    (lambda d: squad_file(d, context="x " * (MAX_CONTEXT_CHARACTERS // 2 + 1)),
     f"convattn reads contexts of up to {MAX_CONTEXT_CHARACTERS:,}"),
])
def test_malformed_files_are_one_usage_error(tmp_path, build, message):
    with pytest.raises(UsageError) as caught:
        load_squad_file(build(tmp_path), "1.1")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_v11_file_is_refused_as_v20(tmp_path):
    with pytest.raises(UsageError, match=r"is a SQuAD 1\.1 file .* use `version` 1\.1"):
        load_squad_file(FIXTURES / "train-v1.1.json", "2.0")
    unversioned = squad_file(tmp_path, version=None)  # no "version" field, no is_impossible: the v1.1 layout
    with pytest.raises(UsageError, match="no \"is_impossible\" field in any question"):
        load_squad_file(unversioned, "2.0")
    assert len(load_squad_file(unversioned, "1.1")) == 1


def test_the_fixtures_read_as_their_versions():
    for version in ("1.1", "2.0"):
        for split in ("train", "dev"):
            assert len(load_squad_file(FIXTURES / f"{split}-v{version}.json", version, split)) > 0


@pytest.mark.skipif(not SHARED_SAMPLE.is_file(), reason=f"shared SQuAD sample not found at {SHARED_SAMPLE}")
def test_the_official_sample_is_v11_only():
    assert len(load_squad_file(SHARED_SAMPLE, "1.1", "dev")) == 396
    with pytest.raises(UsageError, match=r"use `version` 1\.1"):
        load_squad_file(SHARED_SAMPLE, "2.0", "dev")


def test_a_few_answers_that_miss_their_start_are_skipped_and_counted(tmp_path, capsys):
    good = [{"id": f"q{k}", "question": "which?", "answers": [{"text": "two", "answer_start": 4}]} for k in range(30)]
    off_by_one = {"id": "bad", "question": "which?", "answers": [{"text": "two.", "answer_start": 4}]}
    path = squad_file(tmp_path, paragraphs=[{"context": "one two three", "qas": [*good, off_by_one]}])
    rows = load_squad_file(path, "1.1", "train")
    assert len(rows) == 30 and "bad" not in rows["id"]
    err = capsys.readouterr().err
    assert "1 answer(s) whose answer_start misses their text left out; 1 question(s)" in err
    assert "answer 'two.', context 'two three'" in err  # where the two part ways, not two identical truncations
    assert len(load_squad_file(path, "1.1", "dev")) == 31  # scoring reads only the answer texts


def test_a_file_whose_answers_mostly_miss_is_refused(tmp_path):
    bad = {"id": "q1", "question": "which?", "answers": [{"text": "two", "answer_start": 0}]}
    with pytest.raises(UsageError, match="1 of 1 questions have no answer that their answer_start points at"):
        load_squad_file(squad_file(tmp_path, bad), "1.1", "train")


@pytest.mark.skipif(not SHARED_SAMPLE.is_file(), reason="needs ../shared/data/squad (the shared SQuAD sample)")
def test_the_shared_sample_trains_with_its_misaligned_questions_skipped(capsys):
    rows = load_squad_file(SHARED_SAMPLE, "1.1", "train")
    assert len(rows) == 393  # 396 questions, 3 of whose answers all miss their answer_start
    assert "3 question(s) without another answer skipped" in capsys.readouterr().err


def deeply_nested(tmp_path: Path) -> Path:
    path = tmp_path / "deep.json"
    path.write_text('{"data": ' + "[" * 200_000 + "]" * 200_000 + "}")
    return path


def fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "fifo")
    return tmp_path / "fifo"


@pytest.mark.parametrize(("build", "message"), [
    (deeply_nested, "JSON nested deeper than Python reads"),
    (lambda d: d, "a directory; give the SQuAD JSON file itself, not its folder"),
    (fifo, "not a regular file (a FIFO, socket or device)"),
    (lambda d: d / "missing.json", "no such file"),
])
def test_what_is_not_a_json_file_is_one_usage_error(tmp_path, build, message):
    with pytest.raises(UsageError) as caught:
        read_squad_json(build(tmp_path))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_an_unanswerable_question_with_answers_is_refused(tmp_path):
    # its answers were dropped without a word: trained and scored as unanswerable
    contradictory = {"id": "q7", "question": "which?", "is_impossible": True,
                     "answers": [{"text": "two", "answer_start": 4}]}
    for split in ("train", "dev"):
        with pytest.raises(UsageError) as caught:
            load_squad_file(squad_file(tmp_path, contradictory, version="v2.0"), "2.0", split)
        message = str(caught.value)
        assert message.startswith(f"{tmp_path / 'train.json'}: question 'q7': \"is_impossible\" is true but the "
                                  "question has 1 answer(s); set \"is_impossible\": false")
        assert "\"plausible_answers\"" in message and "\n" not in message
    plausible = {"id": "q7", "question": "which?", "is_impossible": True, "answers": [],
                 "plausible_answers": [{"text": "two", "answer_start": 4}]}
    assert load_squad_file(squad_file(tmp_path, plausible, version="v2.0"), "2.0", "dev")["answers"] == \
        [{"text": [], "answer_start": []}]


def test_dev_answers_that_occur_nowhere_are_counted(tmp_path, capsys):
    good = [{"id": f"q{k}", "question": "which?", "answers": [{"text": "two  three", "answer_start": 4}]}
            for k in range(30)]  # spaces that differ from the context's still occur
    typo = {"id": "typo", "question": "which?", "answers": [{"text": "tw0", "answer_start": 4},
                                                            {"text": "four", "answer_start": 4}]}
    path = squad_file(tmp_path, paragraphs=[{"context": "one two three", "qas": [*good, typo]}])
    assert len(load_squad_file(path, "1.1", "dev")) == 31  # scored as the official evaluation scores it
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "2 dev answer(s) occur nowhere in their context (1 question(s) without one that does" in err
    assert "question 'typo', answer 'tw0'" in err


def test_dev_answers_mostly_from_elsewhere_are_refused(tmp_path):
    elsewhere = {"id": "q1", "question": "which?", "answers": [{"text": "five", "answer_start": 4}]}
    with pytest.raises(UsageError, match=r"1 of 1 questions have no answer that occurs in their context .*question "
                                         r"'q1', answer 'five'.*check that the file's answers and contexts belong"):
        load_squad_file(squad_file(tmp_path, elsewhere), "1.1", "dev")


@pytest.mark.skipif(not SHARED_SAMPLE.is_file(), reason="needs ../shared/data/squad (the shared SQuAD sample)")
def test_the_shared_samples_dev_answers_that_occur_nowhere_are_said(capsys):
    assert len(load_squad_file(SHARED_SAMPLE, "1.1", "dev")) == 396
    assert "7 dev answer(s) occur nowhere in their context (2 question(s)" in capsys.readouterr().err


def test_hub_training_answers_are_checked_as_a_files_are(monkeypatch, capsys):
    # a hub answer whose answer_start missed its text crashed the windows (answer_end None), a file's was left out
    from datasets import Dataset

    from convattn.data import squad

    rows = [{"id": f"q{k}", "title": "t", "context": "one two three", "question": "which?",
             "answers": {"text": ["two"], "answer_start": [4]}} for k in range(30)]
    rows.append({"id": "bad", "title": "t", "context": "one two three", "question": "which?",
                 "answers": {"text": ["two"], "answer_start": [0]}})
    monkeypatch.setattr(squad, "load_hub_dataset", lambda name, split: Dataset.from_list(rows))
    train = squad.load_squad_hub("1.1", "train")
    assert len(train) == 30 and "bad" not in train["id"]
    assert "rajpurkar/squad (train): 1 answer(s) whose answer_start misses their text left out" in \
        capsys.readouterr().err
    assert len(squad.load_squad_hub("1.1", "dev")) == 31
