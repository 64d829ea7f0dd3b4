"""SQuAD and GLUE jobs fail in one line and leave nothing partial (issue 51): an empty question is refused naming
the file and the question; a full disk while a seed's model is written removes that seed (and, in a new folder,
everything the job wrote), an --overwrite gets the old results back byte for byte; every error is one line."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from helpers.finetune import SENTENCES, SQUAD, job_argv, rewriting_the_model_after
from helpers.folders import entries, one_error_line, snapshot
from helpers.tiny import save_tiny_checkpoint
from transformers import Trainer

from convattn.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), SENTENCES)


def argv(job: str, checkpoint: Path, out: Path, *extra: str, train: Path = SQUAD / "train-v1.1.json",
         dev: Path = SQUAD / "dev-v1.1.json") -> list[str]:
    return job_argv(job, checkpoint, out, "--max-steps", "2", "--batch-size", "8" if job == "glue" else "4", *extra,
                    train=train, dev=dev)


def with_question(source: Path, folder: Path, question: str) -> tuple[Path, str]:
    """A copy of a SQuAD file whose first question reads `question`; returns it and that question's id."""
    data = json.loads(source.read_text())
    qa = data["data"][0]["paragraphs"][0]["qas"][0]
    qa["question"] = question
    folder.mkdir(exist_ok=True)
    copy = folder / source.name
    copy.write_text(json.dumps(data))
    return copy, qa["id"]


@pytest.mark.parametrize(("split", "question", "said"), [
    ("train", "", "the question is empty"),
    ("train", "  \t ", "the question is whitespace only"),
    ("dev", "\n", "the question is whitespace only"),
])
def test_an_empty_question_is_refused_naming_the_file_and_the_question(checkpoint, tmp_path, capsys, split,
                                                                       question, said):
    files = {"train": SQUAD / "train-v1.1.json", "dev": SQUAD / "dev-v1.1.json"}
    files[split], qid = with_question(files[split], tmp_path / "data", question)
    out = tmp_path / "out"
    assert main(argv("squad", checkpoint, out, train=files["train"], dev=files["dev"])) == 2
    one_error_line(capsys.readouterr().err, "squad", f"{files[split]}: question {qid!r}: {said}",
                   "write its text, or remove the question")
    assert entries(out) == []


def disk_full_at_the_model(monkeypatch) -> None:
    """The disk fills while a seed's fine-tuned model is written (part of the weights already on it)."""
    def full(self, output_dir=None, _internal_call=False):
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "model.safetensors").write_bytes(b"part of the weights")
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(output_dir) / "model.safetensors"))

    monkeypatch.setattr(Trainer, "save_model", full)


@pytest.mark.parametrize("job", ["glue", "squad"])
def test_a_full_disk_in_a_new_folder_is_one_line_and_leaves_nothing(checkpoint, tmp_path, capsys, monkeypatch, job):
    disk_full_at_the_model(monkeypatch)
    out = tmp_path / "out"
    assert main(argv(job, checkpoint, out)) == 2
    one_error_line(capsys.readouterr().err, job, "No space left on device", "model.partial", "free some space")
    assert entries(out) == []  # no model.partial/, no half seed, no record: the same command starts afresh


@pytest.mark.parametrize("job", ["glue", "squad"])
def test_a_full_disk_during_an_overwrite_gives_the_old_results_back(checkpoint, tmp_path, capsys, monkeypatch, job):
    out = tmp_path / "out"
    assert main(argv(job, checkpoint, out)) == 0
    before = snapshot(out)
    disk_full_at_the_model(monkeypatch)
    assert main(argv(job, checkpoint, out, "--overwrite", "--lr", "1e-3")) == 2
    one_error_line(capsys.readouterr().err, job, "No space left on device", "free some space")
    assert snapshot(out) == before


def test_a_full_disk_in_a_later_seed_keeps_the_finished_ones_and_removes_only_its_own(checkpoint, tmp_path, capsys,
                                                                                      monkeypatch):
    out = tmp_path / "out"
    assert main(argv("squad", checkpoint, out)) == 0
    before = snapshot(out)
    disk_full_at_the_model(monkeypatch)
    assert main(argv("squad", checkpoint, out, "--seeds", "2", "--save-models", "all")) == 2
    one_error_line(capsys.readouterr().err, "squad", "No space left on device")
    assert not (out / "runs" / "squad1.1" / "seed1").exists()
    after = snapshot(out)
    assert {name: value for name, value in after.items() if name != "log.txt"} == \
        {name: value for name, value in before.items() if name != "log.txt"}


@pytest.mark.parametrize("message", ["PytorchStreamWriter failed writing file data/0:\nfile write failed",
                                     "Error while serializing:\n  IoError(StorageFull)"])
def test_a_machine_failure_with_a_message_of_several_lines_is_one_line(monkeypatch, capsys, message):
    import convattn.commands.squad as command

    def fails(args):
        raise RuntimeError(message)

    monkeypatch.setattr(command, "add_arguments", lambda parser: parser.set_defaults(func=fails))
    assert main(["squad"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    one_error_line(err, "squad", "free some space")


def test_an_error_message_of_several_lines_is_said_on_one(monkeypatch, capsys):
    import convattn.commands.glue as command
    from convattn.errors import UsageError

    def fails(args):
        raise UsageError("a table:\n| a | b |\n| 1 | 2 |")

    monkeypatch.setattr(command, "add_arguments", lambda parser: parser.set_defaults(func=fails))
    assert main(["glue"]) == 2
    assert capsys.readouterr().err == "convattn glue: error: a table: | a | b | | 1 | 2 |\n"


def test_a_refused_squad_leaves_no_folder_not_even_its_default_parent(checkpoint, tmp_path, monkeypatch, capsys):
    """Without --output-dir the run goes to ./squad/<model>/; refused (offline, no SQuAD files given), neither
    folder stays (issue 66: an empty ./squad/ was left)."""
    monkeypatch.chdir(tmp_path)
    assert main(["squad", "--model", str(checkpoint), "--version", "1.1", "--seeds", "1"]) == 2
    one_error_line(capsys.readouterr().err, "squad", "from the HF hub", "--train-file and --dev-file")
    assert entries(tmp_path) == []


def test_a_model_rewritten_between_squad_seeds_never_mixes_into_one_table(checkpoint, tmp_path, capsys, monkeypatch):
    """As GLUE's (tests/training/glue): a `pretrain --resume` finishing into --model while the seeds run is refused
    at the next seed's load, the finished seed kept, no results written."""
    import shutil

    from convattn.training.squad import job

    model, out = tmp_path / "model", tmp_path / "out"
    shutil.copytree(checkpoint, model)
    monkeypatch.setattr(job, "fine_tune", rewriting_the_model_after(job.fine_tune, model))
    assert main(argv("squad", model, out, "--seeds", "2")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("convattn squad: error: --model") and "changed while this job ran" in err
    seeds = sorted(p.parent.name for p in out.rglob("run.json"))
    assert seeds == ["seed0"] and not (out / "squad_results.json").exists()
