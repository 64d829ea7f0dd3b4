"""GLUE fine-tuning with the papers' protocol: recipes, seeds, metrics, results (what every fine-tuning task
shares, layer-wise lr decay included, is in training/finetune/).

    settings.py   a paper's recipe (`GlueRecipe`) resolved per task (`GlueSettings`)
    metrics.py    task metrics in points, the submission format
    data.py       a task's splits, tokenized
    run.py        one task x seed: fine-tune, score the dev sets, predict the test sets -> run.json
    results.py    aggregation over seeds -> glue_results.json, glue_results.md, submission/
    job.py        `run_glue`: GLUE's `FineTuneJob` (its tasks' data, settings, scores) run by the
                  fine-tuning driver (checks, every task and seed, finished runs skipped, aggregation)

Layout of an output directory: glue_model.json (the model fine-tuned: its fingerprint keys the reuse of finished
runs), runs/<task>/seed<k>/ (see run.py), glue_results.json, glue_results.md,
submission/ (best-dev seed's test predictions per task).
"""

from convattn.training.glue.data import check_data, check_task_files
from convattn.training.glue.job import run_glue
from convattn.training.glue.metrics import column_score, score_predictions, submission_text
from convattn.training.glue.settings import load_glue_recipe, resolve_settings

__all__ = ["check_data", "check_task_files", "column_score", "load_glue_recipe", "resolve_settings", "run_glue",
           "score_predictions", "submission_text"]
