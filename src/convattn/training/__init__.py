"""Training: pretraining (`pretrain`) with named recipes (`recipes`), fine-tuning (`glue`, `squad` on
`finetune`), and comparisons (`compare`).

One vocabulary across the jobs:

    job     what one command does: a pretraining run, every task x seed of `convattn glue`, every seed of
            `convattn squad`, a comparison's whole grid. Each job package's entry is its `job.py`.
    run     one model trained from one seed: a pretraining run (a pretraining job is one run; a comparison
            has one per grid row and seed), one fine-tuning seed (glue/run.py, squad/run.py, each finished
            with its run.json).
    options what a job is asked to do: `PretrainOptions`, `CompareOptions` and the fine-tuning jobs a
            comparison runs (`GlueOptions`, `SquadOptions`); `*Settings` are a fine-tuning run's
            hyperparameters, resolved from a paper's recipe (pretraining's: its `Recipe`).
"""
