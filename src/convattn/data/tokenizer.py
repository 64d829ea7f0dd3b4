"""Tokenizers: train an uncased SentencePiece-style unigram model, or load a pretrained one.

A trained tokenizer is wrapped as a `PreTrainedTokenizerFast` (so it saves beside the model and loads
with `AutoTokenizer`) and adds the BERT special tokens: `[CLS] a [SEP]` and `[CLS] a [SEP] b [SEP]`.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import datasets
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from convattn.data.cache import cache_entry
from convattn.errors import UsageError, option
from convattn.files import write_json_atomic

MAX_VOCAB_SIZE = 1_000_000  # far above any published encoder; a typo beyond it would exhaust memory
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TRAINING_CHARS = 30_000_000  # the unigram model is fitted on (at most) this much text from the start of the corpus
TOKENIZER_VERSION = 2  # 2: [MASK] takes the space before it


def check_vocab_size(vocab_size: int) -> None:
    if vocab_size <= len(SPECIAL_TOKENS):
        raise UsageError(
            f"{option('vocab_size')} {vocab_size} leaves no room for text pieces after the {len(SPECIAL_TOKENS)} "
            f"special tokens ({' '.join(SPECIAL_TOKENS)}); use a vocabulary of a few thousand (e.g. 8000 or 30000)"
        )
    if vocab_size > MAX_VOCAB_SIZE:
        raise UsageError(f"{option('vocab_size')} {vocab_size:,} is above {MAX_VOCAB_SIZE:,} pieces (the papers use "
                         "30,000; multilingual models about 250,000)")


def _training_text(texts: datasets.Dataset) -> Iterator[list[str]]:
    used = 0
    for batch in texts.iter(batch_size=1000):
        yield batch["text"]
        used += sum(map(len, batch["text"]))
        if used >= TRAINING_CHARS:
            return


def _fit_in_worker(tokenizer: Tokenizer, trainer_arguments: dict, texts: datasets.Dataset,
                   scratch_dir: Path | None) -> Tokenizer:
    """`tokenizer` trained by `unigram_worker.py` in a process of its own. In this process the Rust trainer
    would swallow a Ctrl-C that lands while it pulls text, and hold one back until it ends while it fits (for
    minutes); waiting for a child instead, Ctrl-C (or SIGTERM, made a KeyboardInterrupt by the command line)
    stops the run at once, and the child with it."""
    with tempfile.TemporaryDirectory(prefix="convattn-unigram-", dir=scratch_dir) as scratch:
        directory = Path(scratch)
        tokenizer.save(str(directory / "untrained.json"))
        write_json_atomic(directory / "trainer.json", trainer_arguments)
        with open(directory / "text.jsonl", "w", encoding="utf-8") as f:
            for batch in _training_text(texts):
                f.writelines(json.dumps(row) + "\n" for row in batch)
        with open(directory / "stderr.txt", "w+", encoding="utf-8") as stderr:
            worker = subprocess.Popen([sys.executable, "-P", str(Path(__file__).with_name("unigram_worker.py")),
                                       str(directory)], stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr)
            try:
                worker.wait()
            except BaseException:
                worker.kill()
                worker.wait()
                raise
            stderr.seek(0)
            said = stderr.read().strip().splitlines()
        if worker.returncode < 0:
            raise RuntimeError(f"tokenizer training was killed by signal {-worker.returncode} (out of memory?)")
        if worker.returncode != 0:
            raise RuntimeError(f"tokenizer training failed: {said[-1] if said else worker.returncode}")
        return Tokenizer.from_file(str(directory / "trained.json"))


def _normalized_alphabet(tokenizer: Tokenizer, texts: datasets.Dataset) -> set[str]:
    """The characters the trainer needs a piece for: those of the normalized, pre-tokenized training text."""
    alphabet: set[str] = set()
    for batch in _training_text(texts):
        for words in tokenizer.pre_tokenizer.pre_tokenize_str(tokenizer.normalizer.normalize_str(" ".join(batch))):
            alphabet.update(words[0])
    return alphabet


def _too_small_vocabulary(tokenizer: Tokenizer, texts: datasets.Dataset, vocab_size: int) -> UsageError:
    characters = len(_normalized_alphabet(tokenizer, texts))
    reserved = len(SPECIAL_TOKENS) + 1  # the trainer keeps one unknown piece of its own
    needed = characters + reserved
    return UsageError(
        f"--vocab-size {vocab_size} is too small for this corpus: its text has {characters:,} distinct characters "
        f"after normalisation, each needs a piece, and {reserved} more are reserved; use --vocab-size {needed} or "
        f"more (e.g. {-(-(needed + 1) // 1000) * 1000})"
    )


def train_tokenizer(texts: datasets.Dataset, vocab_size: int, max_length: int,
                    scratch_dir: Path | None = None) -> PreTrainedTokenizerFast:
    """Fit a lowercasing unigram tokenizer with `vocab_size` pieces (special tokens included); the training
    text is copied to a temporary directory (under `scratch_dir` if given) for the trainer's process."""
    check_vocab_size(vocab_size)
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Lowercase(), normalizers.Replace(Regex(r"\s+"), " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = dict(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), unk_token="[UNK]", show_progress=False)
    try:
        tokenizer = _fit_in_worker(tokenizer, trainer, texts, scratch_dir)
    except RuntimeError as err:
        if "not large enough to contain all chars" in str(err):
            raise _too_small_vocabulary(tokenizer, texts, vocab_size) from None
        raise
    if tokenizer.get_vocab_size() > vocab_size:  # the trainer overshoots a size just above the character count
        raise _too_small_vocabulary(tokenizer, texts, vocab_size)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    # [MASK] takes the space before it, as ALBERT's and DeBERTa-v2's unigram tokenizers do: "a [MASK] b" is then
    # "▁a [MASK] ▁b", and a filled-in piece "▁word" decodes with one space, not after a lone "▁" piece
    tokenizer.add_special_tokens([AddedToken("[MASK]", lstrip=True, normalized=False, special=True)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=max_length, pad_token="[PAD]", unk_token="[UNK]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def load_tokenizer(directory: str | Path, flag: str = "--tokenizer") -> PreTrainedTokenizerBase:
    """A tokenizer saved by `convattn pretrain` or any pretrained HF tokenizer directory; errors name `flag`."""
    path = Path(directory).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {directory}: not a directory; give the directory a tokenizer was saved to "
                         "(tokenizer.json and its config), not a file in it")
    if not path.is_dir():
        raise UsageError(f"{flag} {directory}: no such directory; give a directory saved by a tokenizer")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"{flag} {directory}: cannot load a tokenizer from it ({first_line[:160]}); save the "
                         "tokenizer into it (tokenizer.save_pretrained)") from None
    missing = [name for name in ("pad_token", "mask_token") if getattr(tokenizer, name) is None]
    if missing:
        raise UsageError(f"{flag} {directory}: the tokenizer has no {' or '.join(missing)}, which MLM needs")
    check_special_tokens(tokenizer, f"{flag} {directory}")
    return tokenizer


def check_special_tokens(tokenizer: PreTrainedTokenizerBase, name: str) -> None:
    """[PAD], [MASK] and [UNK] are pieces of their own: a mask token that is the unknown piece (or the padding)
    would hide nothing from masked-LM training, or mask every unknown word."""
    roles = {role: getattr(tokenizer, f"{role}_token_id") for role in ("pad", "mask", "unk")
             if getattr(tokenizer, f"{role}_token") is not None}
    shared = [role for role, token_id in roles.items() if list(roles.values()).count(token_id) > 1]
    if shared:
        raise UsageError(f"{name}: the tokenizer's {' and '.join(shared)} tokens are the same piece (id "
                         f"{roles[shared[0]]}); each needs its own")


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Changes whenever the tokenizer would split text differently (not with the truncation and padding that
    its last call left set)."""
    if tokenizer.is_fast:
        state = json.loads(tokenizer.backend_tokenizer.to_str())
        state.pop("truncation", None)
        state.pop("padding", None)
        text = json.dumps(state, sort_keys=True)
    else:
        text = repr(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def trained_tokenizer(texts: datasets.Dataset, corpus_identity: str, vocab_size: int, max_length: int,
                      cache_dir: Path) -> PreTrainedTokenizerFast:
    """`train_tokenizer`, cached under `cache_dir` by corpus and vocabulary size (every run, the one that
    trained it included, loads it from the cache, so all get the same tokenizer)."""
    check_vocab_size(vocab_size)
    key = hashlib.sha256(f"{corpus_identity}|{vocab_size}|v{TOKENIZER_VERSION}".encode()).hexdigest()[:16]
    directory = cache_dir / "tokenizers" / f"unigram-{vocab_size}-{key}"
    cache_entry(directory, lambda tmp: train_tokenizer(texts, vocab_size, max_length, tmp).save_pretrained(str(tmp)),
                "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    tokenizer.model_max_length = max_length
    return tokenizer
