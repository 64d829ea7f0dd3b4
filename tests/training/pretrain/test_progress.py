"""The progress bar of a time-budget run counts the budget's seconds: from those already spent on a resume, never
past the budget; its postfix and evaluation lines give the logged numbers."""

from types import SimpleNamespace

from convattn.training.pretrain.callbacks import PretrainProgress


def test_a_budget_bar_starts_at_the_seconds_spent_and_stops_at_the_budget(capsys):
    """A resumed run's bar goes on from the clock's seconds (not 0, counted twice otherwise); the last step's
    overshoot past the deadline leaves it full, not beyond."""
    clock = SimpleNamespace(budget=60.0, spent=12.4)
    progress = PretrainProgress(clock, "k=3")
    state = SimpleNamespace(is_world_process_zero=True, global_step=7)
    progress.on_train_begin(None, state, None)
    bar = progress.training_bar
    assert (bar.n, bar.total) == (12, 60)
    clock.spent = 30.6
    progress.on_step_end(None, state, None)
    assert bar.n == 31
    clock.spent = 64.0
    progress.on_step_end(None, state, None)
    assert bar.n == 60
    progress.on_log(None, state, None, logs={"loss": 2.34567, "tokens_per_second": 1234.6, "learning_rate": 1e-4})
    progress.on_log(None, state, None, logs={"eval_loss": 7.1, "eval_perplexity": 1234.56})
    assert progress.postfix == {"loss": "2.346", "tok/s": "1235", "eval_ppl": "1234.6"}
    progress.close()
    assert "k=3: step 7: eval perplexity 1,234.6" in capsys.readouterr().out
