"""Masked-LM perplexity of a saved model at several input lengths (length generalisation).

The eval text is tokenized once into one token stream and cut into [CLS] + (L - 2) tokens + [SEP] blocks at each
length L, so every length scores the same text: with a cap on the blocks (`max_blocks`), the stream's first
max_blocks x (longest L - 2) tokens, each length taking all its whole blocks of them (a length's last partial block,
fewer than L tokens, is left out). Capping each length's blocks instead would score 8x more text at 1,024 than at
128, and text's difficulty would read as a length's effect. 15% of the stream's tokens, drawn once (`seed`), are
replaced by [MASK] at every length, so lengths differ by context alone (no 80/10/10: the score is the model's guess
at a hidden token); perplexity = exp(total loss / masked tokens). A model whose absolute position embeddings or
Linformer projections stop at max_position_embeddings is reported as unable to extend, not run. An ELECTRA run is
scored by its generator, the masked LM it holds (its eval perplexity in training is the generator's too); a folder
without a masked-LM head (an encoder alone, a fine-tuned classifier) is refused.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MASK_PROBABILITY = 0.15
# blocks of the longest length scored by default: 65,408 tokens at 1,024, on which one mask draw moved a model's
# perplexity at a length by 4-6 % (RESULTS 6.2); more text (compare --eval-length-blocks) narrows that
MAX_BLOCKS = 64
# what a cached score was computed by (training/compare/lengths.py): 2, the same tokens and masks at every length;
# 3, an ELECTRA run scored by its generator (2 gave its discriminator a masked-LM head drawn at random)
PROTOCOL = 3


@dataclass(frozen=True)
class LengthResult:
    length: int
    perplexity: float | None  # None when the model cannot take inputs this long
    masked_tokens: int
    blocks: int
    note: str = ""


def token_stream(tokenizer, texts: Iterable[str]) -> torch.Tensor:
    import torch

    ids = []
    for text in texts:
        if text.strip():
            ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
    return torch.tensor(ids, dtype=torch.long)


def blocks_of(stream: torch.Tensor, length: int, first, last) -> torch.Tensor:
    """Every whole `first` + (length - 2) items + `last` block of `stream`, from its start: token ids between [CLS]
    and [SEP], or the stream's mask between two unmasked ends."""
    import torch

    body = length - 2
    count = len(stream) // body
    inner = stream[: count * body].view(count, body)
    return torch.cat([torch.full((count, 1), first), inner, torch.full((count, 1), last)], dim=1)


def perplexity_at(encoder, head, mask_token_id: int, blocks: torch.Tensor, selected: torch.Tensor,
                  batch_size: int) -> tuple[float, int]:
    """exp(summed loss / count) of the tokens `selected` marks in `blocks`, each replaced by [MASK], as the masked
    LM `head`(`encoder`) predicts them."""
    import torch

    from convattn.losses import masked_lm_loss

    total, count = 0.0, 0
    device = next(encoder.parameters()).device
    for start in range(0, len(blocks), batch_size):
        ids, chosen = blocks[start: start + batch_size], selected[start: start + batch_size]
        inputs = ids.masked_fill(chosen, mask_token_id).to(device)
        labels = ids.masked_fill(~chosen, -100).to(device)
        with torch.no_grad():
            hidden = encoder(input_ids=inputs).last_hidden_state
            total += masked_lm_loss(head, hidden, labels, reduction="sum").item()
        count += int(chosen.sum())
    return math.exp(min(total / max(count, 1), 50.0)), count


def masked_lm(model_dir: str | os.PathLike, device: str = "cpu"):
    """(encoder, head, config) of the masked LM saved in `model_dir`: a masked-LM run's, or an ELECTRA run's
    generator; a folder with no masked-LM head is refused (loading one would score a head drawn at random)."""
    from convattn.config import ConvAttnConfig
    from convattn.electra import ConvAttnForPreTraining
    from convattn.model import ConvAttnForMaskedLM

    config = ConvAttnConfig.from_pretrained(model_dir)
    if "ConvAttnForPreTraining" in (config.architectures or []):
        model = ConvAttnForPreTraining.from_pretrained(model_dir, use_safetensors=True).eval().to(device)
        return model.generator, model.generator_head, model.config
    model, loading = ConvAttnForMaskedLM.from_pretrained(model_dir, use_safetensors=True, output_loading_info=True)
    if missing := [key for key in loading["missing_keys"] if key.startswith("mlm_head.")]:
        held = ", ".join(config.architectures or ["an encoder alone"])
        raise ValueError(f"{model_dir} holds no masked-LM head ({held}: {len(missing)} of the head's tensors "
                         "missing); score the folder of a pretraining run (its model.safetensors)")
    model = model.eval().to(device)
    return model.convattn, model.mlm_head, model.config


def evaluate_at_lengths(model_dir: str | os.PathLike, texts: Iterable[str] | Sequence[str | os.PathLike],
                        lengths: Sequence[int], *, batch_size: int = 8, max_blocks: int | None = MAX_BLOCKS,
                        seed: int = 0, device: str = "cpu") -> list[LengthResult]:
    """Perplexity of the masked-LM model saved in `model_dir` at each length, every length on the same tokens
    (`max_blocks` blocks of the longest length; None: the whole text). `texts` is an iterable of strings or a list
    of text-file paths (one document per line)."""
    import torch
    from transformers import AutoTokenizer

    bad = [n for n in lengths if not isinstance(n, int) or n < 3]
    if bad:
        raise ValueError(f"lengths {bad} must be integers >= 3 ([CLS] + at least one token + [SEP])")
    texts = list(texts)
    if texts and all(isinstance(t, Path) or (isinstance(t, str) and os.path.isfile(t)) for t in texts):
        texts = [line for path in texts for line in Path(path).read_text(encoding="utf-8").splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoder, head, config = masked_lm(model_dir, device)
    limit = config.max_input_length
    stream = token_stream(tokenizer, texts)
    if max_blocks is not None:  # the same tokens at every length: max_blocks blocks of the longest
        stream = stream[:max_blocks * (max(lengths) - 2)]
    # one draw over the stream: every length hides the same tokens, so lengths differ by context alone (a draw per
    # length moved one model's perplexity at a length by up to 5 % on 65,408 tokens of WikiText-103 valid)
    chosen = torch.rand(len(stream), generator=torch.Generator().manual_seed(seed)) < MASK_PROBABILITY
    results = []
    for n in lengths:
        if limit is not None and n > limit:
            kind = "absolute position embeddings" if config.position_embedding_type == "absolute" else (
                "Linformer projections")
            results.append(LengthResult(n, None, 0, 0, f"cannot extend: {kind} stop at {limit}"))
            continue
        blocks = blocks_of(stream, n, tokenizer.cls_token_id, tokenizer.sep_token_id)
        if len(blocks) == 0:
            results.append(LengthResult(n, None, 0, 0, f"eval text too short for one block of {n} tokens"))
            continue
        perplexity, masked = perplexity_at(encoder, head, tokenizer.mask_token_id, blocks,
                                           blocks_of(chosen, n, False, False), batch_size)
        if masked == 0:  # no guess was scored: exp(0 / 1) would read as a perfect model
            results.append(LengthResult(n, None, 0, len(blocks), f"no token masked in {len(blocks)} block(s) of {n} "
                                                                 "tokens: give more eval text"))
            continue
        results.append(LengthResult(n, perplexity, masked, len(blocks)))
    return results
