"""metrics.jsonl rows: the interval's train loss, one row a step, elapsed_seconds goes on after a resume; a time-budget
run records its training clock."""

import json
from types import SimpleNamespace

import pytest

from convattn.training.pretrain.budget import TrainingClock
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


@pytest.mark.timing
def test_elapsed_seconds_continues_from_the_checkpoint_after_a_resume(tmp_path):
    rows = [{"step": 10, "perplexity": 9.0, "elapsed_seconds": 100.0},
            {"step": 20, "perplexity": 8.0, "elapsed_seconds": 200.0},
            {"step": 30, "perplexity": 7.0, "elapsed_seconds": 300.0}]  # after the checkpoint: computed again
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    writer = MetricsWriter(tmp_path)
    writer.keep_until(20)
    row = evaluate(writer, 30)
    assert 200.0 <= row["elapsed_seconds"] < 260.0
    assert "training_seconds" not in row  # a step budget has no training clock


def test_a_time_budget_run_records_its_training_time_on_both_clocks(tmp_path):
    writer = MetricsWriter(tmp_path, TrainingClock(budget=60.0, spent={"compute": 42.04, "wall": 51.26}))
    row = evaluate(writer, 5)
    assert (row["training_seconds"], row["clock"]) == (42.0, "compute")
    assert (row["training_compute_seconds"], row["training_wall_seconds"]) == (42.0, 51.3)
    wall = MetricsWriter(tmp_path, TrainingClock(budget=60.0, clock="wall", spent={"compute": 42.04, "wall": 51.26}))
    assert (evaluate(wall, 6)["training_seconds"], evaluate(wall, 7)["clock"]) == (51.3, "wall")
