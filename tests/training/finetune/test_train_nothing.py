"""A fine-tuning run that would train nothing is refused before anything is written (issue 51): epochs whose
steps round to one step that the warmup runs at learning rate 0, or --max-steps 1 under a warmup. The least
value that trains is named, computed from the data size and the batch; just above it, the run trains. A guard
behind the check: a run that took no step above learning rate 0 is neither saved nor scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.finetune import SENTENCES, job_argv
from helpers.folders import entries, one_error_line, snapshot
from helpers.tiny import save_tiny_checkpoint

from convattn.cli import main
from convattn.errors import UsageError
from convattn.training.finetune.settings import FineTuneSettings, check_trains, least_epochs, optimizer_steps
from convattn.training.glue import job as glue_job

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), SENTENCES)


def argv(job: str, checkpoint: Path, out: Path, *extra: str) -> list[str]:
    return job_argv(job, checkpoint, out, "--batch-size", "32", *extra)


REFUSED = [  # job, flags -> what the one line says
    pytest.param("glue", ["--epochs", "0.01"],
                 ["--epochs 0.01 trains nothing on sst2: 48 training examples in batches of 32 make 2 steps an "
                  "epoch, so 0.01 epochs is 1 step,", "--warmup-ratio 0.1", "learning rate 0",
                  "give --epochs 0.501 or more"],
                 id="glue-epochs"),
    pytest.param("glue", ["--epochs", "0.5"], ["give --epochs 0.501 or more"], id="glue-epochs-at-the-bound"),
    pytest.param("glue", ["--max-steps", "1"],
                 ["--max-steps 1 trains nothing", "give --max-steps 2 or more, or --warmup-ratio 0"],
                 id="glue-max-steps"),
    pytest.param("squad", ["--epochs", "0.001"],
                 ["--epochs 0.001 trains nothing on SQuAD v1.1:", "training windows in batches of 32",
                  "learning rate 0", "give --epochs "], id="squad-epochs"),
    pytest.param("squad", ["--max-steps", "1", "--warmup-ratio", "0.5"],
                 ["--max-steps 1 trains nothing", "--warmup-ratio 0.5", "give --max-steps 2 or more"],
                 id="squad-max-steps"),
]


@pytest.mark.parametrize(("job", "flags", "needles"), REFUSED)
def test_a_run_that_trains_nothing_is_refused_before_anything_is_written(checkpoint, tmp_path, capsys, job, flags,
                                                                        needles):
    out = tmp_path / "out"
    assert main(argv(job, checkpoint, out, *flags)) == 2
    one_error_line(capsys.readouterr().err, job, *needles)
    assert entries(out) == []


@pytest.mark.parametrize("job", ["glue", "squad"])
def test_an_overwrite_that_would_train_nothing_leaves_the_old_results(checkpoint, tmp_path, capsys, job):
    out = tmp_path / "out"
    assert main(argv(job, checkpoint, out, "--max-steps", "2")) == 0
    before = snapshot(out)
    assert main(argv(job, checkpoint, out, "--overwrite", "--max-steps", "1")) == 2
    one_error_line(capsys.readouterr().err, job, "--max-steps 1 trains nothing")
    assert snapshot(out) == before


def test_the_least_value_named_trains(checkpoint, tmp_path, capsys):
    """glue: 48 examples in batches of 32, 2 steps an epoch: 0.501 epochs is 2 steps (the second above lr 0)."""
    assert main(argv("glue", checkpoint, tmp_path / "out", "--epochs", "0.501")) == 0
    run = json.loads((tmp_path / "out" / "runs" / "sst2" / "seed0" / "run.json").read_text())
    assert run["train"]["steps"] == 2


def test_the_squad_line_names_a_value_that_trains(checkpoint, tmp_path, capsys):
    assert main(argv("squad", checkpoint, tmp_path / "refused", "--epochs", "0.001")) == 2
    least = one_error_line(capsys.readouterr().err, "squad").split("give --epochs ")[1].split(" ")[0]
    assert main(argv("squad", checkpoint, tmp_path / "out", "--epochs", least)) == 0


def test_the_guard_refuses_a_run_that_took_no_step_above_learning_rate_zero(checkpoint, tmp_path, capsys,
                                                                           monkeypatch):
    monkeypatch.setattr(glue_job, "check_trains", lambda *args, **kwargs: None)  # past the check, into training
    out = tmp_path / "out"
    assert main(argv("glue", checkpoint, out, "--max-steps", "1")) == 2
    one_error_line(capsys.readouterr().err, "glue", "fine-tuning took 1 step(s), none at a learning rate above 0",
                   "neither saved nor scored")
    assert not list(out.glob("runs/*/seed*/run.json")) and not list(out.glob("**/model.safetensors"))
    assert not (out / "glue_results.json").exists()


def settings(**fields) -> FineTuneSettings:
    values = dict(learning_rate=1e-3, batch_size=32, epochs=1.0, warmup_ratio=0.1, weight_decay=0.0,
                  layer_decay=1.0, adam_epsilon=1e-6, max_length=32)
    return FineTuneSettings(**{**values, **fields})


@pytest.mark.parametrize(("fields", "examples", "steps", "trains"), [
    ({"epochs": 0.01}, 48, 1, False),         # 2 steps an epoch, rounded up to 1 step: warmup
    ({"epochs": 0.501}, 48, 2, True),
    ({"epochs": 0.01, "warmup_ratio": 0.0}, 48, 1, True),  # no warmup: the one step runs at the peak
    ({"max_steps": 1}, 48, 1, False),
    ({"max_steps": 2, "warmup_ratio": 0.9}, 48, 2, True),  # warmup of 2 steps: the second runs at half the peak
    ({"epochs": 3.0}, 1, 3, True),            # one example: one step an epoch
    ({"epochs": 3.0}, 0, 3, False),           # an empty training set
])
def test_steps_as_the_trainer_counts_them(fields, examples, steps, trains):
    assert optimizer_steps(settings(**fields), examples) == steps
    if trains:
        check_trains(settings(**fields), examples, "sst2")
    else:
        with pytest.raises(UsageError, match=r"trains nothing|empty"):
            check_trains(settings(**fields), examples, "sst2")


@pytest.mark.parametrize("per_epoch", [1, 2, 3, 6, 7, 1000, 12_345])
def test_the_least_epochs_named_is_the_least_that_trains_to_three_digits(per_epoch):
    import math

    least = float(least_epochs(2, per_epoch))
    assert math.ceil(least * per_epoch) >= 2  # trains, as the Trainer rounds
    digits = len(least_epochs(2, per_epoch).split(".")[1]) if "." in least_epochs(2, per_epoch) else 0
    assert math.ceil((least - 10**-digits) * per_epoch) < 2  # one unit of its last digit less does not

