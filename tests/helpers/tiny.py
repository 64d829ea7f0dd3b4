"""Scaled-down configs of every preset, so structure-level tests run in seconds."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from convattn import ConvAttnConfig, ConvAttnForMaskedLM
from convattn.presets import preset_fields

TINY = dict(vocab_size=101, embedding_size=16, hidden_size=32, num_attention_heads=4, intermediate_size=64,
            num_hidden_layers=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def tiny_config(preset: str, **overrides) -> ConvAttnConfig:
    fields = dict(TINY)
    if preset_fields(preset).get("linformer_k"):
        # keep the projection meaningful at test lengths: n_max 64, k 16 (conv kernel = stride = 4)
        fields.update(max_position_embeddings=64, linformer_k=16)
    fields.update(overrides)
    return ConvAttnConfig.from_preset(preset, **fields)


def randomize_(module: torch.nn.Module, seed: int = 0) -> None:
    """Give every parameter a random value (zero-initialised tables would hide bugs)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)


def tiny_wordpiece_tokenizer(sentences: list[str], vocab_size: int = 800) -> PreTrainedTokenizerFast:
    """A BERT-style WordPiece tokenizer ([CLS] A [SEP] B [SEP], lower-cased) trained on `sentences`."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(sentences, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def save_tiny_checkpoint(path: Path, sentences: list[str], preset: str = "chang2021-small/composite") -> Path:
    """A tiny MLM checkpoint (2 layers, hidden 32) with a WordPiece tokenizer trained on `sentences`."""
    fast = tiny_wordpiece_tokenizer(sentences)
    config = ConvAttnConfig.from_preset(preset, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=64, embedding_size=32, vocab_size=len(fast),
                                        pad_token_id=fast.pad_token_id)
    torch.manual_seed(0)
    ConvAttnForMaskedLM(config).save_pretrained(path)
    fast.save_pretrained(path)
    return path


def save_tiny_mlm(path: Path, preset: str = "chang2021-small/composite") -> Path:
    """A tiny `preset` masked LM (seeded initialisation) saved to `path`, without a tokenizer."""
    torch.manual_seed(0)
    ConvAttnForMaskedLM(tiny_config(preset)).save_pretrained(path)
    return path


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Recompute each layer's activations in backward (non-reentrant); transformers before 5.24 names it
    gradient_checkpointing_enable."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def step_of(model: torch.nn.Module, loss: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(the loss, each parameter's gradient) after loss.backward()."""
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_step(steps: list[tuple[torch.Tensor, dict[str, torch.Tensor]]]) -> None:
    """Two `step_of`s: the same loss and the same gradients, for the same parameters."""
    (first_loss, first), (second_loss, second) = steps
    torch.testing.assert_close(second_loss, first_loss)
    assert first.keys() == second.keys() and first
    for name in first:
        torch.testing.assert_close(second[name], first[name], msg=name)
