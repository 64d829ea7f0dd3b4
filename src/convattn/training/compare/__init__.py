"""Comparing models on one pretraining budget (`convattn compare`, `convattn plot kernel-size`).

Every run of a comparison gets the same data, the same tokenizer, the same recipe and budget, and the same
seeds (seed k sets initialisation, data order and masking). Layout of the output directory:

    compare.json                written first: the folder is a comparison's (another folder is refused)
    tokenizer/                  the one tokenizer of every run (trained once here, unless given)
    runs/<run>/seed<k>/         a normal `convattn pretrain` output directory per run and seed
    runs/<run>/seed<k>/glue/    `convattn glue` output, when GLUE tasks are asked for
    runs/<run>/seed<k>/squad/   `convattn squad` output, when a SQuAD version is asked for
    runs/<run>/memory.json      the run's training-memory measurement
    report.md, report.html      one table row per run, settings, the figure  (report.py, results.py)
    perplexity.png              eval perplexity vs training step, one line per run
    perplexity_cost.png         under a time budget: the same vs training time and vs tokens seen
    metrics.csv                 one row per run x seed x evaluation
    summary.csv                 one row per run

A run directory whose final model and metrics exist is reused as it is; one with a checkpoint resumes from
it; anything else starts again.

Modules: grids.py (what to compare), options.py (each run's options), job.py (train, resume or reuse every run),
memory.py (training memory), results.py, curves.py (seeds' curves on one grid) and report.py (the report),
lengths.py (perplexity at other input lengths), kernel_size.py (ConvBERT's kernel-size sweep).
"""
