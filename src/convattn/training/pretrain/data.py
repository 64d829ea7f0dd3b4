"""Pretraining data: corpus -> tokenizer -> formatted, cached examples, and the collators that batch them."""

from __future__ import annotations

import hashlib
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding, PreTrainedTokenizerBase

from convattn.console import say
from convattn.data.corpus import load_corpus
from convattn.data.formatting import cache_key, cached_format
from convattn.data.tokenizer import load_tokenizer, tokenizer_fingerprint, trained_tokenizer
from convattn.training.pretrain.options import PretrainOptions

PAD_MULTIPLE = 8  # the collators pad each batch to a multiple of this many tokens


@dataclass
class PretrainData:
    tokenizer: PreTrainedTokenizerBase
    train: object  # datasets.Dataset
    eval: object
    corpus: str
    seq_len: int
    fingerprint: str  # of the train and eval text (`text_fingerprint`): a resumed run must read the same
    tokenizer_fingerprint: str  # of how the tokenizer splits text: a resumed run must split it the same way
    eval_overlap: str | None = None  # eval text that is training text, allowed: what the record and report say


def text_fingerprint(*datasets) -> str:
    """sha256 over the rows of text datasets (16 hex digits): the same text gives the same value, wherever it was
    read from."""
    digest = hashlib.sha256()
    for dataset in datasets:
        for batch in dataset.iter(batch_size=10_000):
            digest.update(("\n".join(batch["text"]) + "\n").encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def prepare_data(options: PretrainOptions, seq_len: int, resume_from: Path | None) -> PretrainData:
    recipe, cache = options.recipe, options.cache_dir
    say("pretrain", "reading the corpus" + ("" if options.dataset or options.train_files else
                                " (the embedded default: installed documentation, extracted once and cached)"))
    corpus = load_corpus(options.dataset, options.dataset_config, options.train_files, options.eval_files, cache,
                         options.allow_eval_overlap)
    say("pretrain", f"corpus: {corpus.description}; {len(corpus.train):,} train / {len(corpus.eval):,} eval lines")
    for note in corpus.notes:
        say("pretrain", note)
    if options.tokenizer:
        tokenizer = load_tokenizer(options.tokenizer)
        say("pretrain", f"tokenizer: {options.tokenizer}, {len(tokenizer):,} pieces")
    elif resume_from is not None and (resume_from / "tokenizer.json").exists():
        tokenizer = load_tokenizer(resume_from)
    else:
        say("pretrain", f"tokenizer: unigram, up to {recipe.vocab_size:,} pieces (trained once per corpus, then "
                        "cached)")
        tokenizer = trained_tokenizer(corpus.train, corpus.identity, recipe.vocab_size, seq_len, cache)
        if len(tokenizer) < recipe.vocab_size:
            say("pretrain", f"tokenizer: {len(tokenizer):,} pieces built, fewer than the {recipe.vocab_size:,} "
                            f"asked with --vocab-size (this corpus holds no more); the model's vocabulary is "
                            f"{len(tokenizer):,}")
    splits = tokenizer_fingerprint(tokenizer)
    key = cache_key(corpus.identity, splits, recipe.format, seq_len)
    directory = cache / "formatted" / key
    say("pretrain", f"formatting: {recipe.format}, {seq_len} tokens (cached in {directory})")
    train = cached_format(corpus.train, tokenizer, recipe.format, seq_len, directory / "train")
    evaluation = cached_format(corpus.eval, tokenizer, recipe.format, seq_len, directory / "eval")
    if recipe.eval_samples:
        evaluation = evaluation.select(range(min(recipe.eval_samples, len(evaluation))))
    say("pretrain", f"data: {len(train):,} train / {len(evaluation):,} eval examples")
    return PretrainData(tokenizer, train, evaluation, corpus.description, seq_len,
                        text_fingerprint(corpus.train, corpus.eval), splits, corpus.eval_overlap)


@dataclass
class MaskingCollator:
    """Pads and masks (15%, 80/10/10, never special or pad tokens) with a generator seeded from the tokens, so
    masks do not depend on the global RNG: a resumed run masks exactly as the uninterrupted one. Training seeds
    one generator per batch; `per_example` (evaluation) one per example, so each example's masks are the same
    whatever batch or process it lands in, and eval perplexity does not change with the number of processes."""

    tokenizer: PreTrainedTokenizerBase
    mlm_probability: float
    seed: int
    per_example: bool = False

    def __post_init__(self):
        self.masking = DataCollatorForLanguageModeling(self.tokenizer, mlm_probability=self.mlm_probability,
                                                       pad_to_multiple_of=PAD_MULTIPLE)

    def __call__(self, features: list[dict]) -> dict:
        stop_workers_as_ctrl_c()
        if not self.per_example:
            return self._masked(features)
        masked = [self._masked([feature]) for feature in features]  # each (1, its own padded length)
        width = max(example["input_ids"].shape[1] for example in masked)
        fill = {"input_ids": self.tokenizer.pad_token_id, "labels": -100}  # attention mask, types: 0
        return {key: torch.cat([torch.nn.functional.pad(example[key], (0, width - example[key].shape[1]),
                                                        value=fill.get(key, 0)) for example in masked])
                for key in masked[0]}

    def _masked(self, features: list[dict]) -> dict:
        digest = hashlib.sha256(str(self.seed).encode())
        for feature in features:
            digest.update(np.asarray(feature["input_ids"], dtype=np.int64).tobytes())
        self.masking.generator = torch.Generator().manual_seed(int.from_bytes(digest.digest()[:8], "little") >> 1)
        batch = padded(features, self.tokenizer)
        if batch is None:  # rows `padded` does not know: transformers' own collator, at its own pace
            return self.masking(features)
        # what the collator's call does after padding, by its own masking
        batch["input_ids"], batch["labels"] = self.masking.torch_mask_tokens(
            batch["input_ids"], special_tokens_mask=batch.pop("special_tokens_mask", None))
        return batch


@dataclass
class PaddingCollator:
    """ELECTRA masks inside the model; its batches are only padded (special_tokens_mask included), as
    DataCollatorWithPadding pads them."""

    tokenizer: PreTrainedTokenizerBase

    def __call__(self, features: list[dict]) -> dict:
        stop_workers_as_ctrl_c()
        batch = padded(features, self.tokenizer)
        if batch is None:  # rows `padded` does not know: transformers' own collator
            return DataCollatorWithPadding(self.tokenizer, pad_to_multiple_of=PAD_MULTIPLE)(features)
        return batch


_worker_stops_set = False  # whether this process is a data loader's worker whose SIGTERM stops it as Ctrl-C does


def _stop(signum, frame):
    raise KeyboardInterrupt


def stop_workers_as_ctrl_c() -> None:
    """In a data loader's worker process (a GPU run collates in them: trainer.loader_workers), once: a SIGTERM
    stops it as Ctrl-C does, which torch's worker loop ends cleanly. torch's own handler lets a worker die of a
    SIGTERM its parent did not send, and a job scheduler's SIGTERM reaches the whole process group: the main process,
    stopping the run as Ctrl-C does, then reported its workers' deaths as a crash over its orderly stop."""
    global _worker_stops_set
    if _worker_stops_set or torch.utils.data.get_worker_info() is None:
        return
    signal.signal(signal.SIGTERM, _stop)
    _worker_stops_set = True


def padding_collator(tokenizer: PreTrainedTokenizerBase) -> PaddingCollator:
    return PaddingCollator(tokenizer)


def padded(features: list[dict], tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor] | None:
    """The batch `tokenizer.pad(features, pad_to_multiple_of=PAD_MULTIPLE, return_tensors="pt")` makes, the same
    values and dtype, for rows of lists of the columns pretraining rows carry; None for anything else (another
    column, no pad token, a tokenizer whose main input or masks differ).
    tokenizer.pad builds its tensors from nested lists: a masked batch of 128 pairs of 128 tokens took 8.7 ms to
    collate, 2.1 ms with arrays filled here, on the host between a GPU's steps (`python benchmarks/collate.py`)."""
    fills = {"input_ids": tokenizer.pad_token_id, "token_type_ids": tokenizer.pad_token_type_id,
             "attention_mask": 0, "special_tokens_mask": 1}
    columns = list(features[0].keys())
    if (tokenizer.pad_token_id is None or tokenizer.model_input_names[:1] != ["input_ids"]
            or "attention_mask" not in tokenizer.model_input_names
            or any(column not in fills or not isinstance(features[0][column], list) for column in columns)):
        return None
    lengths = [len(feature["input_ids"]) for feature in features]
    width = -(-max(lengths) // PAD_MULTIPLE) * PAD_MULTIPLE
    left = tokenizer.padding_side == "left"
    batch = {}
    for column in [*columns, *(["attention_mask"] if "attention_mask" not in columns else [])]:
        made = column not in columns  # an attention mask made here: every token real
        values = np.full((len(features), width), fills[column], dtype=np.int64)
        for row, (feature, length) in enumerate(zip(features, lengths, strict=True)):
            place = slice(width - length, width) if left else slice(0, length)
            values[row, place] = 1 if made else feature[column]
        batch[column] = torch.from_numpy(values)
    return batch
