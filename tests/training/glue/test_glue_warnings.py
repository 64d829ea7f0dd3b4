"""A GLUE classifier that gives every dev example one class is named in the results (synthetic runs)."""

import json

import numpy as np

from convattn.data.glue import get_task
from convattn.training.glue.metrics import one_class_warning
from convattn.training.glue.results import aggregate


def test_one_class_for_every_dev_example_is_warned_about():
    sst2 = get_task("sst2")
    warning = one_class_warning(sst2, "dev", np.array([1, 1, 1, 1]))
    assert warning.startswith("dev: predicts 'positive' for every one of the 4 dev examples")
    assert one_class_warning(sst2, "dev", np.array([0, 1, 1, 1])) is None
    assert one_class_warning(get_task("stsb"), "dev", np.array([2.5, 2.5])) is None  # regression: no classes


def write_run(output_dir, task: str, seed: int, warnings: list[str], code: str = "aaa") -> None:
    run = {"task": task, "seed": seed, "model": "m", "init": "pretrained", "settings": None, "encoder_params": 10,
           "metrics": {"dev": {"accuracy": 50.0}}, "scores": {"SST": 50.0}, "test_predictions": [],
           "warnings": warnings, "convattn_source": code}
    folder = output_dir / "runs" / task / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(run))


def test_the_results_list_each_runs_warnings(tmp_path):
    write_run(tmp_path, "sst2", 0, ["dev: predicts 'positive' for every one of the 872 dev examples"])
    write_run(tmp_path, "sst2", 1, [])
    results = aggregate(tmp_path)
    assert results["warnings"] == ["sst2 seed 0: dev: predicts 'positive' for every one of the 872 dev examples"]
    table = (tmp_path / "glue_results.md").read_text()
    assert "## Warnings\n\n- sst2 seed 0: dev: predicts 'positive'" in table


def test_the_results_say_when_seeds_were_fine_tuned_by_different_code(tmp_path):
    write_run(tmp_path, "sst2", 0, [], code="aaa")
    write_run(tmp_path, "sst2", 1, [], code="bbb")
    results = aggregate(tmp_path)
    assert len(results["warnings"]) == 1 and "(code aaa: sst2 seed 0; code bbb: sst2 seed 1)" in results["warnings"][0]
    assert "- these results put together runs of different convattn code" in (tmp_path / "glue_results.md").read_text()


def test_a_constant_sts_prediction_scores_0_and_is_warned_never_nan():
    """Pearson and Spearman are undefined for a constant prediction (scipy: NaN, which broke the seeds' statistics
    and reached the tables as 'nan'): scored 0 and said."""
    from convattn.training.glue.metrics import constant_prediction_warning, score_predictions

    stsb, constant = get_task("stsb"), np.array([2.5, 2.5, 2.5])
    assert score_predictions(stsb, constant, np.array([1.0, 2.0, 4.0])) == {"pearson": 0.0, "spearman": 0.0}
    assert "predicts 2.500 for every one of the 3 dev examples" in constant_prediction_warning(stsb, "dev", constant)
    assert constant_prediction_warning(stsb, "dev", np.array([2.5, 3.0])) is None
    assert constant_prediction_warning(get_task("sst2"), "dev", np.array([1, 1])) is None
    # constant gold scores (a small dev subset of one score) are as undefined: 0, never NaN
    assert score_predictions(stsb, np.array([1.0, 2.0, 4.0]), np.array([3.0, 3.0, 3.0])) == {"pearson": 0.0,
                                                                                          "spearman": 0.0}


def test_no_dev_predictions_warn_of_nothing():
    """No dev examples (a split filtered to nothing) gives no warning, rather than failing while writing one."""
    from convattn.training.glue.metrics import constant_prediction_warning

    empty = np.array([])
    assert one_class_warning(get_task("sst2"), "dev", empty.astype(int)) is None
    assert constant_prediction_warning(get_task("stsb"), "dev", empty) is None


def test_a_partial_glue_score_is_starred_and_said(tmp_path):
    """A GLUE mean over fewer columns than GLUE's is no GLUE score: its cell is starred and the table says of which
    columns it is the mean."""
    write_run(tmp_path, "sst2", 0, [])
    write_run(tmp_path, "sst2", 1, [])
    results = aggregate(tmp_path)
    assert results["glue"]["columns"] == ["SST"] and not results["glue"]["complete"]
    table = (tmp_path / "glue_results.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| ? |"))  # runs without settings: no model
    assert row.endswith(" | 50.0 ± 0.0* |")
    assert "\\* partial GLUE score: mean of SST only." in table
