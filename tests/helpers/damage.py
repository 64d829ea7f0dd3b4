"""Ways a model folder goes bad, for the tests of what refuses one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertForMaskedLM


def nan_weights(folder: Path, every: bool = True) -> None:
    """NaN in every weight (or in the first one only)."""
    weights = load_file(folder / "model.safetensors")
    for tensor in weights.values() if every else [weights[sorted(weights)[0]]]:
        tensor.fill_(float("nan"))
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def integer_weight(folder: Path, name: str = "convattn.encoder.layer.0.output.dense.weight") -> None:
    """One weight rounded to int32 (loading cast it back to float without a word)."""
    weights = load_file(folder / "model.safetensors")
    weights[name] = (weights[name] * 100).round().to(torch.int32)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def config_with(folder: Path, **fields) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


def pickle_only(folder: Path) -> None:
    """The weights as a pickle (pytorch_model.bin) and no safetensors."""
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def foreign_bert(folder: Path) -> None:
    """A tiny `transformers` BERT in place of the folder."""
    shutil.rmtree(folder, ignore_errors=True)
    BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32)).save_pretrained(folder)


def config_without(folder: Path, *names: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in names}))


def swap_tokens(folder: Path, first: str, second: str) -> None:
    """The ids of two pieces exchanged in the saved tokenizer.json (its vocabulary and its added tokens)."""
    state = json.loads((folder / "tokenizer.json").read_text())
    vocab = state["model"]["vocab"]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    ids = {first: vocab[first], second: vocab[second]}
    for token in state["added_tokens"]:
        token["id"] = ids.get(token["content"], token["id"])
    (folder / "tokenizer.json").write_text(json.dumps(state))
