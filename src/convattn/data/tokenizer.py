"""Tokenizers: train an uncased SentencePiece-style unigram model, or load a pretrained one.

A trained tokenizer is wrapped as a `PreTrainedTokenizerFast` (so it saves beside the model and loads
with `AutoTokenizer`) and adds the BERT special tokens: `[CLS] a [SEP]` and `[CLS] a [SEP] b [SEP]`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import datasets
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from convattn.errors import UsageError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TRAINING_CHARS = 30_000_000  # the unigram model is fitted on (at most) this much text from the start of the corpus
TOKENIZER_VERSION = 1


def check_vocab_size(vocab_size: int) -> None:
    if vocab_size <= len(SPECIAL_TOKENS):
        raise UsageError(
            f"--vocab-size {vocab_size} leaves no room for text pieces after the {len(SPECIAL_TOKENS)} special "
            f"tokens ({' '.join(SPECIAL_TOKENS)}); use a vocabulary of a few thousand (e.g. 8000 or 30000)"
        )


def _training_text(texts: datasets.Dataset) -> Iterator[list[str]]:
    used = 0
    for batch in texts.iter(batch_size=1000):
        yield batch["text"]
        used += sum(map(len, batch["text"]))
        if used >= TRAINING_CHARS:
            return


def train_tokenizer(texts: datasets.Dataset, vocab_size: int, max_length: int) -> PreTrainedTokenizerFast:
    """Fit a lowercasing unigram tokenizer with `vocab_size` pieces (special tokens included)."""
    check_vocab_size(vocab_size)
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Lowercase(), normalizers.Replace(Regex(r"\s+"), " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), unk_token="[UNK]",
                                      show_progress=False)
    tokenizer.train_from_iterator(_training_text(texts), trainer=trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=max_length, pad_token="[PAD]", unk_token="[UNK]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def load_tokenizer(directory: str | Path, flag: str = "--tokenizer") -> PreTrainedTokenizerBase:
    """A tokenizer saved by `convattn pretrain` or any pretrained HF tokenizer directory; errors name `flag`."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise UsageError(f"{flag} {directory}: no such directory; give a directory saved by a tokenizer")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"{flag} {directory}: cannot load a tokenizer from it ({first_line[:160]})") from None
    missing = [name for name in ("pad_token", "mask_token") if getattr(tokenizer, name) is None]
    if missing:
        raise UsageError(f"{flag} {directory}: the tokenizer has no {' or '.join(missing)}, which MLM needs")
    return tokenizer


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Changes whenever the tokenizer would split text differently."""
    state = tokenizer.backend_tokenizer.to_str() if tokenizer.is_fast else repr(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(state.encode()).hexdigest()[:16]


def trained_tokenizer(texts: datasets.Dataset, corpus_identity: str, vocab_size: int, max_length: int,
                      cache_dir: Path) -> PreTrainedTokenizerFast:
    """`train_tokenizer`, cached under `cache_dir` by corpus and vocabulary size."""
    check_vocab_size(vocab_size)
    key = hashlib.sha256(f"{corpus_identity}|{vocab_size}|v{TOKENIZER_VERSION}".encode()).hexdigest()[:16]
    directory = cache_dir / "tokenizers" / f"unigram-{vocab_size}-{key}"
    if (directory / "tokenizer.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        tokenizer.model_max_length = max_length
        return tokenizer
    tokenizer = train_tokenizer(texts, vocab_size, max_length)
    tmp = directory.with_name(directory.name + ".tmp")
    tokenizer.save_pretrained(str(tmp))
    tmp.replace(directory)
    return tokenizer
