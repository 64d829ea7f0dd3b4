"""SQuAD v1.1 / v2.0 fine-tuning and evaluation with ELECTRA's protocol (the ConvBERT paper's Table 4).

    settings.py     a recipe (configs/recipes/squad/*.yaml) resolved with overrides (`SquadSettings`)
    features.py     questions -> sliding windows over the context, training spans, max-context flags
    postprocess.py  window logits -> one answer per question (n-best, max answer length, v2.0 null odds)
    metrics.py      exact match and F1 exactly as the official v1.1 / v2.0 evaluation scripts
    run.py          one seed: fine-tune, answer the dev questions, score -> run.json, predictions.json
    results.py      aggregation over seeds -> squad_results.json, squad_results.md
    job.py          `run_squad`: SQuAD's `FineTuneJob` (its data, settings, scores) run by the fine-tuning
                    driver (checks, every seed, finished seeds skipped, aggregation)

Layout of an output directory: squad_model.json (the model fine-tuned: its fingerprint keys the reuse of finished
seeds), runs/squad<version>/seed<k>/ (see run.py), squad_results.json, squad_results.md.
"""

from convattn.training.squad.job import run_squad

__all__ = ["run_squad"]
