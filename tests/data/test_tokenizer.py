"""Unigram tokenizer: uncased, BERT special tokens, saves/loads with AutoTokenizer, cached per corpus."""

from __future__ import annotations

import datasets
import pytest
from transformers import AutoTokenizer

from convattn.data.tokenizer import SPECIAL_TOKENS, load_tokenizer, train_tokenizer, trained_tokenizer
from convattn.errors import UsageError

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly bumpkins".split()  # noqa: SIM905


def texts(n: int = 400) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"text": [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12))
                                                for i in range(n)]})


def test_trained_tokenizer_is_uncased_with_bert_specials(tmp_path):
    tokenizer = train_tokenizer(texts(), vocab_size=120, max_length=64)
    assert len(tokenizer) <= 120
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tokenizer.pad_token_id == 0 and tokenizer.mask_token == "[MASK]"
    assert tokenizer("The QUICK Fox")["input_ids"] == tokenizer("the quick fox")["input_ids"]
    pair = tokenizer("quick fox", "lazy dog")
    tokens = tokenizer.convert_ids_to_tokens(pair["input_ids"])
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
    first_sep = tokens.index("[SEP]")
    assert pair["token_type_ids"] == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded("quick fox", "lazy dog")["input_ids"] == pair["input_ids"]
    assert load_tokenizer(tmp_path).mask_token_id == tokenizer.mask_token_id


def test_vocabulary_must_exceed_the_special_tokens():
    with pytest.raises(UsageError, match="--vocab-size 5"):
        train_tokenizer(texts(10), vocab_size=5, max_length=64)


def test_bad_tokenizer_directory(tmp_path):
    with pytest.raises(UsageError, match="no such directory"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(UsageError, match="cannot load a tokenizer"):
        load_tokenizer(tmp_path)


def test_training_is_cached_per_corpus_and_size(tmp_path, monkeypatch):
    first = trained_tokenizer(texts(), "corpus-a", 100, 64, tmp_path)
    monkeypatch.setattr("convattn.data.tokenizer.train_tokenizer", lambda *a: pytest.fail("trained again"))
    second = trained_tokenizer(texts(), "corpus-a", 100, 64, tmp_path)
    assert second.get_vocab() == first.get_vocab()
    assert len(list((tmp_path / "tokenizers").iterdir())) == 1
