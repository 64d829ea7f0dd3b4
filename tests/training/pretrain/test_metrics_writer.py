"""metrics.jsonl rows: the interval's train loss, one row a step, elapsed_seconds goes on from the checkpoint's
time; a time-budget run records its training clock."""

import json
from types import SimpleNamespace

import pytest
import torch

from convattn.training.pretrain import callbacks
from convattn.training.pretrain.budget import StepMeter, TrainingClock
from convattn.training.pretrain.callbacks import MetricsWriter


def evaluate(writer: MetricsWriter, step: int) -> dict:
    state = SimpleNamespace(is_world_process_zero=True, global_step=step, num_input_tokens_seen=step * 100)
    writer.on_log(None, state, None, logs={"loss": 2.0, "tokens_per_second": 50.0, "learning_rate": 1e-4})
    writer.on_log(None, state, None, logs={"eval_loss": 1.5, "eval_perplexity": 4.48})
    return writer.rows[-1]


def test_a_rows_train_loss_is_the_mean_of_its_intervals_logged_losses_and_a_step_has_one_row(tmp_path):
    writer = MetricsWriter(tmp_path)
    state = SimpleNamespace(is_world_process_zero=True, global_step=10, num_input_tokens_seen=1000)
    for loss, rate in ((2.0, 40.0), (4.0, 60.0)):
        writer.on_log(None, state, None, logs={"loss": loss, "tokens_per_second": rate, "learning_rate": 1e-4})
    writer.on_log(None, state, None, logs={"eval_loss": 1.5, "eval_perplexity": 4.48})
    assert (writer.rows[-1]["train_loss"], writer.rows[-1]["tokens_per_second"]) == (3.0, 60.0)
    state.global_step = 20
    writer.on_log(None, state, None, logs={"loss": 1.0, "tokens_per_second": 70.0, "learning_rate": 1e-4})
    writer.on_log(None, state, None, logs={"eval_loss": 1.4, "eval_perplexity": 4.06})
    assert writer.rows[-1]["train_loss"] == 1.0  # the losses logged since the last evaluation only
    # an evaluation logged again at a step replaces that step's row
    writer.on_log(None, state, None, logs={"eval_loss": 1.3, "eval_perplexity": 3.67})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], row["perplexity"], row["train_loss"]) for row in rows] == [(10, 4.48, 3.0), (20, 3.67, None)]


def test_elapsed_seconds_goes_on_from_the_checkpoints_time_after_a_resume(tmp_path, monkeypatch):
    """The checkpoint at step 20 was saved 250 s into the run (its row, at 200 s, came before the save): rows after
    the resume go on from 250 s, and the time of the steps after the checkpoint, trained again, counts once."""
    now = [5000.0]
    monkeypatch.setattr(MetricsWriter, "wall", staticmethod(lambda: now[0]))
    rows = [{"step": 10, "perplexity": 9.0, "elapsed_seconds": 100.0},
            {"step": 20, "perplexity": 8.0, "elapsed_seconds": 200.0},
            {"step": 30, "perplexity": 7.0, "elapsed_seconds": 300.0}]  # after the checkpoint: computed again
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    writer = MetricsWriter(tmp_path)
    writer.keep_until(20, elapsed=250.0)
    now[0] += 40.0
    row = evaluate(writer, 30)
    assert row["elapsed_seconds"] == 290.0
    assert "training_seconds" not in row  # a step budget has no training clock
    assert writer.state() == {"args": {}, "attributes": {"elapsed_seconds": 290.0}}  # what the next save keeps

    # a checkpoint that does not say (saved before it was kept): from the last row kept
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    writer = MetricsWriter(tmp_path)
    writer.keep_until(20)
    now[0] += 40.0
    assert evaluate(writer, 30)["elapsed_seconds"] == 240.0


@pytest.mark.parametrize(("saved", "read"), [
    ({"MetricsWriter": {"args": {}, "attributes": {"elapsed_seconds": 251.25}}}, 251.25),
    ({"MetricsWriter": [{"args": {}, "attributes": {"elapsed_seconds": 7}}]}, 7.0),
    ({}, None),                                                                    # saved before it was kept
    ({"MetricsWriter": {"args": {}, "attributes": {"elapsed_seconds": "250"}}}, None),  # damaged: not trusted
    ({"MetricsWriter": {"args": {}, "attributes": {"elapsed_seconds": float("inf")}}}, None),
    ({"MetricsWriter": {"args": {}, "attributes": {"elapsed_seconds": -3.0}}}, None),
    ({"MetricsWriter": {"args": {}, "attributes": {"elapsed_seconds": True}}}, None),
    ({"MetricsWriter": {"args": {}, "attributes": [250.0]}}, None),
])
def test_a_checkpoints_elapsed_time_is_read_where_it_is_a_time(tmp_path, saved, read):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 20, "stateful_callbacks": saved}))
    assert callbacks.elapsed_at(tmp_path) == read


def test_a_time_budget_run_records_its_training_time_on_both_clocks(tmp_path):
    writer = MetricsWriter(tmp_path, TrainingClock(budget=60.0, spent={"compute": 42.04, "wall": 51.26}))
    row = evaluate(writer, 5)
    assert (row["training_seconds"], row["clock"]) == (42.0, "compute")
    assert (row["training_compute_seconds"], row["training_wall_seconds"]) == (42.0, 51.3)
    wall = MetricsWriter(tmp_path, TrainingClock(budget=60.0, clock="wall", spent={"compute": 42.04, "wall": 51.26}))
    assert (evaluate(wall, 6)["training_seconds"], evaluate(wall, 7)["clock"]) == (51.3, "wall")


def test_a_rows_numbers_are_the_last_logs_and_the_states_rounded_as_documented(tmp_path, monkeypatch):
    """Every field of a row on a clock the test controls: the losses to 5 decimals, perplexity to 3, elapsed seconds
    to 1; the learning rate and tokens/s of the interval's last training log, the tokens seen of the state; an
    ELECTRA evaluation's own losses and accuracy to 5 decimals."""
    now = [1000.0]
    monkeypatch.setattr(MetricsWriter, "wall", staticmethod(lambda: now[0]))
    writer = MetricsWriter(tmp_path)
    state = SimpleNamespace(is_world_process_zero=True, global_step=40, num_input_tokens_seen=12345)
    writer.on_log(None, state, None, logs={"loss": 2.0, "tokens_per_second": 40.0, "learning_rate": 3e-4})
    writer.on_log(None, state, None, logs={"loss": 2.1234567, "tokens_per_second": 61.2, "learning_rate": 2e-4})
    now[0] += 123.456
    writer.on_log(None, state, None, logs={"eval_loss": 1.23456789, "eval_perplexity": 3.43698765,
                                           "eval_generator_loss": 2.3456789, "eval_discriminator_loss": 0.4567891,
                                           "eval_discriminator_accuracy": 0.87654321, "eval_runtime": 1.23456789})
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {
        "step": 40, "train_loss": 2.06173, "eval_loss": 1.23457, "perplexity": 3.437, "tokens_per_second": 61.2,
        "learning_rate": 2e-4, "tokens_seen": 12345, "elapsed_seconds": 123.5, "generator_loss": 2.34568,
        "discriminator_loss": 0.45679, "discriminator_accuracy": 0.87654}


def test_resuming_drops_the_rows_after_the_checkpoint_from_metrics_jsonl_at_once(tmp_path):
    """A resumed run stopped before its next evaluation must not leave rows of the discarded steps in the file."""
    rows = [{"step": 10, "perplexity": 9.0, "elapsed_seconds": 100.0},
            {"step": 20, "perplexity": 8.0, "elapsed_seconds": 200.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    MetricsWriter(tmp_path).keep_until(10)
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == rows[:1]


def test_only_the_main_process_writes_rows(tmp_path):
    """Every rank logs an evaluation; one file, written by rank 0 alone."""
    writer = MetricsWriter(tmp_path)
    state = SimpleNamespace(is_world_process_zero=False, global_step=5, num_input_tokens_seen=500)
    writer.on_log(None, state, None, logs={"loss": 2.0, "tokens_per_second": 50.0, "learning_rate": 1e-4})
    writer.on_log(None, state, None, logs={"eval_loss": 1.5, "eval_perplexity": 4.48})
    assert writer.rows == [] and not (tmp_path / "metrics.jsonl").exists()


def test_a_gpu_step_budget_run_records_no_compute_time_it_did_not_keep(tmp_path):
    """On a GPU a budget that does not read the compute clock keeps no compute total: the row says None, not 0."""
    meter = StepMeter(wall_spent=7.26)
    meter.on_train_begin(SimpleNamespace(device=torch.device("cuda")), None, None)
    row = evaluate(MetricsWriter(tmp_path, meter), 5)
    assert (row["training_wall_seconds"], row["training_compute_seconds"]) == (7.3, None)
