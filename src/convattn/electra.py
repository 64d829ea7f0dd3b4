"""ELECTRA replaced-token detection (Clark et al. 2020), ConvBERT's pretraining objective.

A small generator (the same architecture at `generator_size` x the hidden size, heads and FFN width)
fills in masked tokens; the discriminator (the encoder we keep) learns which tokens were replaced.
Both share the word / position / token-type embeddings and the embedding LayerNorm:

    loss = MLM(generator) + discriminator_weight x BCE(replaced?) over non-pad tokens

The discriminator is `model.convattn`, a plain `ConvAttnModel` under the same prefix as every other
convattn head, so a saved pretraining checkpoint loads straight into e.g.
`ConvAttnForSequenceClassification.from_pretrained(dir)`; `save_discriminator(dir)` writes the
encoder alone (no generator, no heads) for fine-tuning.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.activations import ACT2FN
from transformers.utils import ModelOutput

from convattn.config import ConvAttnConfig
from convattn.model import ConvAttnModel, ConvAttnPreTrainedModel, MaskedLMHead

MASK_TOKEN_PROBABILITY = 0.85  # of those, replaced by [MASK] in the generator input; the rest kept


def generator_config(config: ConvAttnConfig) -> ConvAttnConfig:
    """The discriminator's config with hidden size, heads and FFN width scaled by `generator_size`.

    With ConvBERT the generator keeps at least one self-attention and one conv head (as the reference
    code does when the heads run out: num_attention_heads // head_ratio >= 1).
    """
    fraction = config.generator_size
    fields = config.to_dict()
    for key in ("model_type", "transformers_version", "architectures", "preset"):
        fields.pop(key, None)
    fields.update(
        hidden_size=round(config.hidden_size * fraction),
        num_attention_heads=max(config.head_ratio, round(config.num_attention_heads * fraction)),
        intermediate_size=round(config.intermediate_size * fraction),
    )
    return ConvAttnConfig(**fields)


@dataclass
class ElectraPreTrainingOutput(ModelOutput):
    """`loss` = generator_loss + discriminator_weight x discriminator_loss. `discriminator_logits` (batch, n)
    score "replaced"; `corrupted_ids` is the discriminator's input and `replaced` its labels (token differs
    from the original); `masked` marks the positions the generator predicted."""

    loss: Tensor | None = None
    generator_loss: Tensor | None = None
    discriminator_loss: Tensor | None = None
    discriminator_accuracy: Tensor | None = None
    discriminator_logits: Tensor | None = None
    corrupted_ids: Tensor | None = None
    replaced: Tensor | None = None
    masked: Tensor | None = None


class ReplacedTokenHead(nn.Module):
    """ELECTRA's discriminator head: dense(H -> H) -> activation -> dense_prediction(H -> 1)."""

    def __init__(self, config: ConvAttnConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.dense_prediction(self.act(self.dense(hidden_states))).squeeze(-1)


def masked_capacity(n: int, probability: float) -> int:
    """At least as many positions as `select_masked` picks in any row of n tokens, known before the data."""
    return min(n, max(1, math.ceil(n * probability)))


@dataclass
class MaskedSelection:
    """The positions the generator predicts, in a fixed number of slots per row so that every shape is known
    before the data (one graph under torch.compile): slot s of row b holds position `candidates[b, s]`, masked
    where `chosen[b, s]`; both (batch, masked_capacity(n, probability))."""

    candidates: Tensor
    chosen: Tensor

    def as_mask(self, n: int) -> Tensor:
        """(batch, n) bool: True at the masked positions."""
        mask = torch.zeros(self.candidates.shape[0], n, dtype=torch.bool, device=self.candidates.device)
        return mask.scatter(1, self.candidates, self.chosen)

    def gather(self, x: Tensor) -> Tensor:
        """The candidate slots of a (batch, n, ...) tensor: (batch, C, ...)."""
        index = self.candidates.view(*self.candidates.shape, *(1,) * (x.dim() - 2))
        return x.gather(1, index.expand(*self.candidates.shape, *x.shape[2:]))


def select_masked(maskable: Tensor, probability: float) -> MaskedSelection:
    """round(probability x) each row's maskable positions (at least one where any), uniformly at random: the
    positions of the highest random scores, which come first in the candidate slots."""
    count = maskable.sum(dim=1, keepdim=True)
    to_mask = (count * probability).round().clamp(min=1).minimum(count)
    scores = torch.rand(maskable.shape, device=maskable.device).masked_fill(~maskable, -1.0)
    candidates = scores.argsort(dim=1, descending=True)[:, :masked_capacity(maskable.shape[1], probability)]
    slots = torch.arange(candidates.shape[1], device=maskable.device)
    return MaskedSelection(candidates, slots < to_mask)


def gumbel_sample(logits: Tensor) -> Tensor:
    """A sample of softmax(logits) per row (temperature 1): argmax(logits + Gumbel noise)."""
    uniform = torch.rand_like(logits, dtype=torch.float32).clamp_min(torch.finfo(torch.float32).tiny)  # in (0, 1)
    return (logits.float() - torch.log(-torch.log(uniform))).argmax(dim=-1)


class ConvAttnForPreTraining(ConvAttnPreTrainedModel):
    """Generator + discriminator trained on replaced-token detection; `config` is the discriminator's."""

    # targets -> sources (regular expressions): all of the generator's embedding module (whatever it holds:
    # positions are optional) and its MLM decoder
    _tied_weights_keys = {  # noqa: RUF012
        r"generator\.embeddings\.": r"convattn\.embeddings\.",
        r"generator_head\.decoder\.weight": r"convattn\.embeddings\.word_embeddings\.weight",
    }

    def __init__(self, config: ConvAttnConfig):
        if config.mask_token_id is None:
            raise ValueError("mask_token_id is None: ConvAttnForPreTraining masks tokens itself, so set "
                             "config.mask_token_id to the tokenizer's [MASK] id")
        if not config.tie_word_embeddings:
            raise ValueError("tie_word_embeddings=False: ELECTRA shares the embeddings between generator and "
                             "discriminator and ties the generator's decoder to them; set it to True")
        super().__init__(config)
        self.convattn = ConvAttnModel(config)
        self.discriminator_head = ReplacedTokenHead(config)
        small = generator_config(config)
        self.generator = ConvAttnModel(small)
        self.generator.embeddings = self.convattn.embeddings
        self.generator_head = MaskedLMHead(small)
        self.post_init()

    def set_attn_implementation(self, attn_implementation) -> None:
        # the generator has a config of its own, which transformers before 5.24 skips (a sub-model whose config
        # has its parent's class)
        super().set_attn_implementation(attn_implementation)
        self.generator.config._attn_implementation = self.config._attn_implementation

    def save_discriminator(self, save_directory: str | os.PathLike, **kwargs) -> None:
        """Save the discriminator encoder alone (a `ConvAttnModel` checkpoint, no generator or heads)."""
        self.convattn.save_pretrained(save_directory, **kwargs)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.convattn.embeddings.word_embeddings

    def get_output_embeddings(self) -> nn.Linear:
        return self.generator_head.decoder

    def generator_input(self, input_ids: Tensor, masked: Tensor) -> Tensor:
        """[MASK] at 85% of the masked positions, the original token at the rest."""
        use_mask_token = masked & (torch.rand(masked.shape, device=masked.device) < MASK_TOKEN_PROBABILITY)
        return input_ids.masked_fill(use_mask_token, self.config.mask_token_id)

    def generator_loss_and_samples(self, hidden: Tensor, input_ids: Tensor,
                                   selection: MaskedSelection) -> tuple[Tensor, Tensor]:
        """The generator's MLM loss over the masked positions (mean) and its sampled token at each candidate slot
        (batch, C); the head runs on the candidate slots only."""
        generator_logits = self.generator_head(selection.gather(hidden)).float()  # (batch, C, V)
        original = selection.gather(input_ids)
        targets = original.masked_fill(~selection.chosen, -100)
        # sum / max(count, 1): a batch without maskable tokens gives loss 0, not NaN
        loss = F.cross_entropy(generator_logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
        loss = loss / selection.chosen.sum().clamp(min=1)
        with torch.no_grad():
            samples = torch.where(selection.chosen, gumbel_sample(generator_logits), original)
        return loss, samples

    def combined_loss(self, generator_loss, discriminator_loss):
        """ELECTRA's objective from its two parts: generator_loss + discriminator_weight x discriminator_loss."""
        return generator_loss + self.config.discriminator_weight * discriminator_loss

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                special_tokens_mask: Tensor | None = None, position_ids: Tensor | None = None,
                **sequence_offsets) -> ElectraPreTrainingOutput:
        """`position_ids` and `sequence_offsets` (cu_seq_lens_q, max_length_q, their _k twins): a flattened batch, as
        `FlatteningCollator(return_special_tokens_mask=True)` lays it out, whose sequences both models read apart;
        masking picks config.mask_probability of each row's maskable tokens, so of the flattened batch's as a
        whole."""
        layout = dict(position_ids=position_ids, **sequence_offsets)
        keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        maskable = keep
        if special_tokens_mask is not None:
            maskable = maskable & ~special_tokens_mask.bool()
        if self.config.pad_token_id is not None:
            maskable = maskable & (input_ids != self.config.pad_token_id)
        selection = select_masked(maskable, self.config.mask_probability)
        masked = selection.as_mask(input_ids.shape[1])
        generator_ids = self.generator_input(input_ids, masked)

        hidden = self.generator(input_ids=generator_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                                **layout).last_hidden_state
        generator_loss, samples = self.generator_loss_and_samples(hidden, input_ids, selection)
        corrupted_ids = input_ids.scatter(1, selection.candidates, samples)
        replaced = corrupted_ids != input_ids
        logits = self.discriminator_head(self.convattn(input_ids=corrupted_ids, attention_mask=attention_mask,
                                                       token_type_ids=token_type_ids, **layout).last_hidden_state)
        discriminator_loss, accuracy = replaced_token_loss(logits, replaced, keep)
        return ElectraPreTrainingOutput(
            loss=self.combined_loss(generator_loss, discriminator_loss),
            generator_loss=generator_loss, discriminator_loss=discriminator_loss,
            discriminator_accuracy=accuracy.detach(), discriminator_logits=logits,
            corrupted_ids=corrupted_ids, replaced=replaced, masked=masked,
        )


def replaced_token_loss(logits: Tensor, replaced: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """Binary cross-entropy of "replaced" and the accuracy of its sign, both means over the real tokens."""
    labels = replaced.float()
    token_loss = F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="none")
    correct = ((logits > 0).float() == labels).float()
    real = keep.sum()
    return token_loss.masked_fill(~keep, 0.0).sum() / real, correct.masked_fill(~keep, 0.0).sum() / real
