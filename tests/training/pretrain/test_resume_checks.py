"""--resume continues only the run it was started as: a checkpoint whose tensors or config differ from the run's
model, a corpus or tokenizer whose content changed, and run files of the wrong shape are each refused in one line
naming the file and field, exit 2, before anything is written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers.folders import one_error_line, snapshot
from helpers.pretrain import InterruptAt, tiny_args, write_corpus
from safetensors.torch import load_file, save_file

from convattn.cli import main


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def stopped_run(corpus, tmp_path_factory):
    """A run stopped at step 5: checkpoints 2 and 4."""
    from convattn.cli import build_parser
    from convattn.commands.pretrain import options_from_args
    from convattn.training.pretrain import pretrain

    out = tmp_path_factory.mktemp("runs") / "stopped"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("CONVATTN_CACHE", str(tmp_path_factory.getbasetemp() / "convattn-cache"))
        pretrain(options_from_args(build_parser().parse_args(tiny_args(corpus, out))), callbacks=[InterruptAt(5)])
    return out


# ---------------------------------------------------------------------------------- ways a run goes wrong
def change_weights(change):
    def damage(run: Path) -> None:
        file = run / "checkpoints" / "checkpoint-4" / "model.safetensors"
        weights = load_file(file)
        change(weights)
        save_file(weights, file, metadata={"format": "pt"})

    return damage


def add_tensor(weights: dict) -> None:
    weights["convattn.extra.weight"] = torch.zeros(3)


def drop_tensor(weights: dict) -> None:
    del weights["convattn.encoder.layer.1.output.dense.weight"]


def reshape_tensor(weights: dict) -> None:
    name = "convattn.encoder.layer.1.output.dense.weight"
    weights[name] = weights[name][:-1].clone()


def another_presets_checkpoint(run: Path) -> None:
    """The weights and config of a chang2021-small/absolute model of the same size, saved over checkpoint-4's."""
    from convattn import ConvAttnConfig, ConvAttnForMaskedLM

    config = ConvAttnConfig.from_preset("chang2021-small/absolute", num_hidden_layers=2, hidden_size=32,
                                        num_attention_heads=4, intermediate_size=64, embedding_size=16,
                                        vocab_size=json.loads((run / "pretrain_data.json").read_text())["vocab_size"])
    ConvAttnForMaskedLM(config).save_pretrained(run / "checkpoints" / "checkpoint-4")


def swap_tokenizer(run: Path) -> None:
    """The saved tokenizer splits differently: two pieces trade their scores (same vocabulary, same size)."""
    file = run / "checkpoints" / "checkpoint-4" / "tokenizer.json"
    tokenizer = json.loads(file.read_text())
    pieces = tokenizer["model"]["vocab"]
    last, first = len(pieces) - 1, next(i for i, (piece, _) in enumerate(pieces) if piece.isalpha())
    pieces[first][1], pieces[last][1] = pieces[last][1], pieces[first][1]
    file.write_text(json.dumps(tokenizer))


def write(name: str, text: str):
    return lambda run: (run / name).write_text(text)


def edit_metrics_row(**fields):
    def damage(run: Path) -> None:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        rows[-1] = {k: v for k, v in {**rows[-1], **fields}.items() if v is not ...}
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    return damage


def edit_data_record(**fields):
    def damage(run: Path) -> None:
        record = json.loads((run / "pretrain_data.json").read_text())
        (run / "pretrain_data.json").write_text(json.dumps({**record, **fields}))

    return damage


DAMAGE = [
    ("an extra tensor", change_weights(add_tensor),
     "model.safetensors holds convattn.extra.weight, which the run's model does not have"),
    ("a missing tensor", change_weights(drop_tensor), "model.safetensors lacks convattn.encoder.layer.1.output.dense"),
    ("a tensor of another shape", change_weights(reshape_tensor),
     "has convattn.encoder.layer.1.output.dense.weight of shape [31, 64], the run's model [32, 64]"),
    ("another preset's checkpoint", another_presets_checkpoint,
     "its config.json has preset 'chang2021-small/absolute', the run's model 'chang2021-small/composite'"),
    ("a swapped tokenizer", swap_tokenizer, "--resume: the tokenizer read now (the one saved in"),
    ("data record: a list", write("pretrain_data.json", "[1, 2]"),
     "pretrain_data.json is damaged or not written by convattn (a list, not the run's data record)"),
    ("data record: a string for a number", edit_data_record(vocab_size="40"),
     "pretrain_data.json is damaged or not written by convattn ('vocab_size' is a string (\"40\"), not an integer)"),
    ("data record: not JSON", write("pretrain_data.json", "{"), "pretrain_data.json is damaged or not written"),
    ("metrics: a missing field", edit_metrics_row(perplexity=...), "metrics.jsonl:2: no 'perplexity' field"),
    ("metrics: a string for a number", edit_metrics_row(step="4"),
     "metrics.jsonl:2: 'step' is a string (\"4\"), not an integer"),
    ("metrics: null for a number", edit_metrics_row(eval_loss=None), "metrics.jsonl:2: 'eval_loss' is null"),
    ("metrics: a NaN", edit_metrics_row(perplexity=float("nan")),
     "metrics.jsonl:2: 'perplexity' is a number (NaN), not a finite number"),
    ("metrics: a boolean for an integer", edit_metrics_row(step=True),
     "metrics.jsonl:2: 'step' is a boolean (true), not an integer"),
]


@pytest.mark.parametrize(("damage", "said"), [case[1:] for case in DAMAGE], ids=[case[0] for case in DAMAGE])
def test_resume_refuses_a_run_that_is_not_the_one_started_and_writes_nothing(stopped_run, tmp_path, capsys, damage,
                                                                            said):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    damage(run)
    before = snapshot(run)
    assert main(["pretrain", "--output-dir", str(run), "--resume"]) == 2
    one_error_line(capsys.readouterr().err, "pretrain", said)
    assert snapshot(run) == before


def test_a_new_run_into_a_run_in_progress_is_refused_and_writes_nothing(stopped_run, corpus, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    before = snapshot(run)
    assert main(tiny_args(corpus, run)) == 2  # neither --resume nor --overwrite
    one_error_line(capsys.readouterr().err, "pretrain", "it holds a pretraining run (in progress)", "--resume",
                   "--overwrite")
    assert snapshot(run) == before


def test_a_checkpoint_that_does_not_fit_names_the_one_before_that_does(stopped_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    another_presets_checkpoint(run)
    assert main(["pretrain", "--output-dir", str(run), "--resume"]) == 2
    one_error_line(capsys.readouterr().err, "pretrain", "checkpoint-4 does not fit the run's model",
                   "delete that folder to resume from checkpoint-2")
    shutil.rmtree(run / "checkpoints" / "checkpoint-4")
    assert main(["pretrain", "--output-dir", str(run), "--resume", "--max-steps", "3", "--allow-schedule-change"]) == 0
    assert (run / "model.safetensors").is_file()


def test_a_corpus_edited_in_place_to_the_same_size_and_time_is_refused(stopped_run, corpus, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    train = corpus / "train.txt"
    text, times = train.read_text(), os.stat(train)
    edited = text.replace("the ", "and ", 1)  # same length
    assert edited != text and len(edited) == len(text)
    before = snapshot(run)
    try:
        train.write_text(edited)
        os.utime(train, ns=(times.st_atime_ns, times.st_mtime_ns))
        assert os.stat(train).st_size == times.st_size and os.stat(train).st_mtime_ns == times.st_mtime_ns
        assert main(["pretrain", "--output-dir", str(run), "--resume"]) == 2
        one_error_line(capsys.readouterr().err, "pretrain", "--resume: the text read now",
                       "is not the text the run in", "started with")
    finally:
        train.write_text(text)
        os.utime(train, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert snapshot(run) == before


def test_a_run_older_than_these_records_resumes_unchecked(stopped_run, tmp_path):
    """Checkpoints without the trained steps, a data record without the tokenizer: what they do not say is not
    checked (and the next checkpoint says it)."""
    from convattn.training.pretrain.callbacks import steps_trained

    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    for state_file in (run / "checkpoints").glob("*/trainer_state.json"):
        state = json.loads(state_file.read_text())
        del state["stateful_callbacks"]["TrainedSteps"]
        state_file.write_text(json.dumps(state))
    record = json.loads((run / "pretrain_data.json").read_text())
    del record["tokenizer"]
    (run / "pretrain_data.json").write_text(json.dumps(record))
    assert main(["pretrain", "--output-dir", str(run), "--resume", "--max-steps", "5", "--allow-schedule-change"]) == 0
    assert steps_trained(run / "checkpoints" / "checkpoint-5") is None and (run / "model.safetensors").is_file()


def test_the_run_records_its_tokenizer_and_a_checkpoint_how_many_steps_trained(stopped_run):
    from convattn.training.pretrain.callbacks import steps_trained

    record = json.loads((stopped_run / "pretrain_data.json").read_text())
    assert set(record) == {"corpus", "fingerprint", "tokenizer", "vocab_size"}
    # --warmup 2: step 1 runs at learning rate 0, steps 2-4 above it
    assert steps_trained(stopped_run / "checkpoints" / "checkpoint-4") == 3
    assert steps_trained(stopped_run / "checkpoints" / "nowhere") is None


@pytest.mark.parametrize(("saved", "steps"), [(3, 3), (0, 0), (True, None), (3.0, None), ("3", None), (None, None)])
def test_a_checkpoint_says_how_many_steps_trained_only_as_a_whole_number(tmp_path, saved, steps):
    """The trained steps decide whether a resumed run trained at all: a damaged record (a flag, a float, a string)
    counts as not recorded, never as 1 or 3 steps."""
    from convattn.training.pretrain.callbacks import steps_trained

    (tmp_path / "trainer_state.json").write_text(json.dumps(
        {"stateful_callbacks": {"TrainedSteps": {"args": {"steps": saved}, "attributes": {}}}}))
    assert steps_trained(tmp_path) == steps
