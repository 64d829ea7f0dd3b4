"""`convattn squad` end to end on hand-written questions: files written, resume, scores, bad input."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from helpers.published import staging_folder_mentions
from helpers.remote import run_without_convattn
from helpers.tiny import save_tiny_checkpoint

from convattn.cli import main
from convattn.data.squad import load_squad_file
from convattn.training.squad.metrics import squad_scores

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "squad"
QUICK = ["--seeds", "1", "--max-steps", "4", "--batch-size", "4", "--max-length", "48", "--doc-stride", "16",
         "--max-query-length", "12"]


pytestmark = pytest.mark.usefixtures("one_thread")

# the python block of a model card, run as written; its last expression's value printed as JSON
RUN_THE_CARD = textwrap.dedent('''
    import ast, json, sys

    code = open(sys.argv[1]).read().split("```python\\n")[1].split("```")[0]
    *body, last = ast.parse(code).body
    namespace = {}
    exec(compile(ast.Module(body, []), "card", "exec"), namespace)
    print(json.dumps(eval(compile(ast.Expression(last.value), "card", "eval"), namespace)))
    assert "convattn" not in sys.modules
''')


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    questions = load_squad_file(FIXTURES / "train-v2.0.json", "2.0")
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qa"),
                                list(questions["context"]) * 3 + list(questions["question"]) * 3)


def squad(checkpoint: Path, out: Path, version: str, *extra: str) -> int:
    return main(["squad", "--model", str(checkpoint), "--version", version, "--train-file",
                 str(FIXTURES / f"train-v{version}.json"), "--dev-file", str(FIXTURES / f"dev-v{version}.json"),
                 "--output-dir", str(out), *QUICK, *extra])


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_fine_tunes_scores_and_resumes(checkpoint, tmp_path, capsys, version):
    out = tmp_path / "squad"
    assert squad(checkpoint, out, version) == 0
    seed = out / "runs" / f"squad{version}" / "seed0"
    run = json.loads((seed / "run.json").read_text())
    predictions = json.loads((seed / "predictions.json").read_text())
    dev = load_squad_file(FIXTURES / f"dev-v{version}.json", version, "dev")
    assert set(predictions) == set(dev["id"])
    assert run["train"]["steps"] == 4 and run["dev"]["questions"] == len(dev)
    assert run["dev"]["windows"] > len(dev)  # 48-token inputs: the contexts need several windows
    nbest = json.loads((seed / "nbest_predictions.json").read_text())
    assert all(predictions[q] in ("", entries[0]["text"]) for q, entries in nbest.items())
    # the recorded scores are the official scoring of the written predictions
    answers = {q: a["text"] for q, a in zip(dev["id"], dev["answers"], strict=True)}
    null_odds = json.loads((seed / "null_odds.json").read_text()) if version == "2.0" else None
    assert run["scores"] == squad_scores(answers, predictions, version, no_answer_probs=null_odds)
    results = json.loads((out / "squad_results.json").read_text())
    assert results["seeds"] == [0] and results["version"] == version
    table = (out / "squad_results.md").read_text()
    assert "| EM | F1 |" in table and ("HasAns EM" in table) == (version == "2.0")

    capsys.readouterr()
    assert squad(checkpoint, out, version) == 0  # finished: reused, not trained again
    assert "already finished" in capsys.readouterr().err
    assert json.loads((seed / "run.json").read_text()) == run

    assert squad(checkpoint, out, version, "--seeds", "2", "--save-models", "all") == 0  # only seed 1 trains
    printed = capsys.readouterr().err  # the seed reused is named (issue 66)
    assert f"v{version}: seed 0 already finished in {out}, reused as they are" in printed, printed
    assert f"v{version} seed 1: fine-tuning" in printed and f"v{version} seed 0: fine-tuning" not in printed
    said = ("training questions in", f"v{version}: seed 0 already", f"v{version} seed 1: fine-tuning",
            f"v{version} seed 1: EM")  # the data, the seeds reused, then each seed trained and its scores
    assert [printed.index(line) for line in said] == sorted(printed.index(line) for line in said), printed
    assert json.loads((seed / "run.json").read_text()) == run
    results = json.loads((out / "squad_results.json").read_text())
    assert results["seeds"] == [0, 1]
    assert (out / "runs" / f"squad{version}" / "seed1" / "model" / "config.json").is_file()  # all: kept
    published = out / "models" / f"squad{version}"
    assert json.loads((published / "fine_tuned.json").read_text())["seed"] == results["best_seed"]
    card = (published / "README.md").read_text()
    assert "pipeline_tag: question-answering" in card and f"# squad{version}: squad{version}\n" in card
    assert repr(str(published)) in card and staging_folder_mentions(published) == []
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    model = AutoModelForQuestionAnswering.from_pretrained(published)
    inputs = AutoTokenizer.from_pretrained(published)("who sat?", "the cat sat .", return_tensors="pt")
    outputs = model(**inputs)
    assert all(value.isfinite().all() for value in outputs.values())  # the joint head's or the span head's
    assert outputs.start_logits.shape == outputs.end_logits.shape == inputs["input_ids"].shape
    if version == "1.1":  # the card's usage, as written, where convattn is not installed
        result = run_without_convattn(tmp_path, RUN_THE_CARD, str(published / "README.md"))
        assert result.returncode == 0, result.stderr[-2000:]
        answer = json.loads(result.stdout.splitlines()[-1])
        context = "The cat sat on the mat while the dog ran in the park."  # the card's example
        assert answer["answer"] and answer["answer"] == context[answer["start"]:answer["end"]]


def test_changed_settings_or_another_model_are_refused(checkpoint, tmp_path, capsys):
    out = tmp_path / "squad"
    assert squad(checkpoint, out, "1.1") == 0
    assert squad(checkpoint, out, "1.1", "--lr", "1e-5") == 2
    assert "other settings" in capsys.readouterr().err
    other = save_tiny_checkpoint(tmp_path / "other", ["some other words entirely"] * 20)
    assert squad(other, out, "1.1") == 2
    assert "another model" in capsys.readouterr().err
    # a missing file is the first cause, before the settings it would change
    assert main(["squad", "--model", str(checkpoint), "--version", "1.1", "--train-file", str(tmp_path / "nope.json"),
                 "--dev-file", str(FIXTURES / "dev-v1.1.json"), "--output-dir", str(out), *QUICK, "--lr", "1e-5"]) == 2
    assert capsys.readouterr().err.strip() == f"convattn squad: error: {tmp_path / 'nope.json'}: no such file"


@pytest.mark.parametrize("content,message", [
    ("", "is empty"),
    ("{\"data\": 3}", "not in the SQuAD layout"),
    ("[1, 2", "not JSON"),
    (json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "one two three", "qas": [
        {"id": "a", "question": "q?", "answers": [{"text": "two", "answer_start": 0}]}]}]}]}), "does not point at"),
    (json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "one two", "qas": [
        {"id": "a", "question": "q?"}]}]}]}), "no \"answers\" list"),
    (json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "one two", "qas": [
        {"id": "a", "question": "q?", "answers": None}]}]}]}), "\"answers\" must be a list"),
    (json.dumps({"data": [{"title": "t", "paragraphs": "one two"}]}), "must be an object with a \"paragraphs\" list"),
])
def test_malformed_training_files_exit_2_with_nothing_written(checkpoint, tmp_path, capsys, content, message):
    bad = tmp_path / "train.json"
    bad.write_text(content)
    out = tmp_path / "squad"
    code = main(["squad", "--model", str(checkpoint), "--version", "1.1", "--train-file", str(bad), "--dev-file",
                 str(FIXTURES / "dev-v1.1.json"), "--output-dir", str(out), *QUICK])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_hub_unavailable_is_one_line_with_a_hint(checkpoint, tmp_path, capsys, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    code = main(["squad", "--model", str(checkpoint), "--version", "2.0", "--output-dir", str(tmp_path / "o"),
                 *QUICK])
    err = capsys.readouterr().err
    assert code == 2 and "rajpurkar/squad_v2" in err and "--train-file" in err


def test_only_one_local_file_is_refused(checkpoint, tmp_path, capsys):
    code = main(["squad", "--model", str(checkpoint), "--version", "1.1", "--train-file",
                 str(FIXTURES / "train-v1.1.json"), "--output-dir", str(tmp_path / "o")])
    assert code == 2 and "--dev-file" in capsys.readouterr().err


def test_a_transformers_convbert_and_its_convattn_conversion_fine_tune(checkpoint, tmp_path):
    from transformers import AutoTokenizer, ConvBertConfig, ConvBertForMaskedLM

    from convattn.interop.convbert import from_transformers

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    config = ConvBertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, embedding_size=32, max_position_embeddings=64,
                            pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    theirs = ConvBertForMaskedLM(config)
    for name, model in (("hf", theirs), ("converted", from_transformers(theirs))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        assert squad(tmp_path / name, tmp_path / f"out-{name}", "1.1") == 0
        run = json.loads((tmp_path / f"out-{name}" / "runs" / "squad1.1" / "seed0" / "run.json").read_text())
        assert run["train"]["steps"] == 4
