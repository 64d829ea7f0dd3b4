"""Pretraining: corpus -> tokenizer -> formatted, cached data -> `Trainer` -> a saved encoder.

    options.py    what a run is asked to do (`PretrainOptions`) and every check made before anything is written
    data.py       corpus, tokenizer, formatted examples, the masking collator
    trainer.py    the model factory, `PretrainTrainer` (exact eval perplexity), its `TrainingArguments`
    callbacks.py  throughput, metrics.jsonl + perplexity.png, the progress bar
    job.py        `pretrain(options)`: the job, one run, start to finish or resumed

Everything the user can get wrong (files, vocabulary, sequence length, preset, output directory) is
checked before the output directory is touched. What the output directory then holds: `convattn.runs.pretrain`;
--overwrite keeps the old run aside until the new one stands: `convattn.runs.replace`.

Eval perplexity is exp(total token loss / total masked tokens) over the whole eval set (ELECTRA: the generator's
loss over the tokens each batch masked); masks are drawn from a generator seeded by each batch's tokens, so every
evaluation scores the same positions.
"""

from convattn.training.pretrain.job import PretrainSummary, pretrain
from convattn.training.pretrain.options import (
    PretrainOptions,
    check_options,
    default_cache_dir,
    model_config,
    per_device_batch,
    sequence_length,
)
from convattn.training.pretrain.trainer import build_model

__all__ = ["PretrainOptions", "PretrainSummary", "build_model", "check_options", "default_cache_dir",
           "model_config", "per_device_batch", "pretrain", "sequence_length"]
