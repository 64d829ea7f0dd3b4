"""ELECTRA's question-answering head, the one ConvBERT's SQuAD numbers come from (ELECTRA's finetune/qa/qa_tasks.py
with `joint_prediction` and `answerable_classifier`, its defaults), selected by `ConvAttnConfig.qa_head = "joint"`.

* start: a linear map per token; positions outside the answer mask (the context and [CLS]) get -1000 added;
* end, given a start s: dense(512, GELU) -> dense(1) of [h_s ; h_j] for each token j, masked the same way.
  Training conditions on the gold start; prediction keeps the `beam` most likely starts (log-probabilities)
  and, for each, the `beam` most likely ends;
* answerable: dense(512, GELU) -> dense(1) of [h_[CLS] ; sum_j p_start(j) h_j], a logit for "no answer",
  trained by binary cross-entropy with weight 0.5 (every SQuAD 1.1 question is answerable).

Loss: (start cross-entropy + end cross-entropy) / 2 + 0.5 x answerable cross-entropy, averaged over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.activations import ACT2FN
from transformers.utils import ModelOutput

MASK_PENALTY = 1000.0
HIDDEN = 512
ANSWERABLE_WEIGHT = 0.5
BEAM = 20


@dataclass
class JointQuestionAnsweringOutput(ModelOutput):
    loss: Tensor | None = None
    start_logits: Tensor | None = None          # (batch, n), masked
    end_logits: Tensor | None = None            # (batch, n) given the gold start (training only)
    start_top_log_probs: Tensor | None = None   # (batch, beam)
    start_top_index: Tensor | None = None       # (batch, beam)
    end_top_log_probs: Tensor | None = None     # (batch, beam, beam): row i for start start_top_index[:, i]
    end_top_index: Tensor | None = None         # (batch, beam, beam)
    answerable_logits: Tensor | None = None     # (batch,): the "no answer" logit
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


def default_answer_mask(attention_mask: Tensor | None, token_type_ids: Tensor | None, shape) -> Tensor:
    """ELECTRA's answer mask: real tokens of the second segment, plus [CLS] (position 0)."""
    mask = torch.ones(shape, dtype=torch.bool) if token_type_ids is None else token_type_ids == 1
    if attention_mask is not None:
        mask = mask & attention_mask.bool()
    mask[:, 0] = True
    return mask


class JointSpanHead(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.start = nn.Linear(hidden_size, 1)
        self.end_hidden = nn.Linear(2 * hidden_size, HIDDEN)
        self.end = nn.Linear(HIDDEN, 1)
        self.answerable_hidden = nn.Linear(2 * hidden_size, HIDDEN)
        self.answerable = nn.Linear(HIDDEN, 1)
        self.act = ACT2FN["gelu"]

    def end_logits(self, start_states: Tensor, hidden: Tensor, penalty: Tensor) -> Tensor:
        """start_states (batch, s, H), hidden (batch, n, H) -> (batch, s, n): the end head on [h_start ; h_j],
        its first dense layer split over the two halves (the same map, without the (s, n, 2H) concatenation)."""
        weight = self.end_hidden.weight
        x = (F.linear(start_states, weight[:, :self.hidden_size])[:, :, None]
             + F.linear(hidden, weight[:, self.hidden_size:], self.end_hidden.bias)[:, None])
        return self.end(self.act(x)).squeeze(-1) + penalty[:, None]

    def forward(self, hidden: Tensor, answer_mask: Tensor, start_positions: Tensor | None = None,
                end_positions: Tensor | None = None, is_impossible: Tensor | None = None,
                beam: int = BEAM) -> JointQuestionAnsweringOutput:
        hidden = hidden.to(self.start.weight.dtype)
        penalty = (answer_mask.float() - 1) * MASK_PENALTY
        start_logits = self.start(hidden).squeeze(-1) + penalty
        pooled = (start_logits.softmax(-1)[..., None] * hidden).sum(1)
        answerable = self.answerable(self.act(self.answerable_hidden(torch.cat([hidden[:, 0], pooled], -1))))
        out = JointQuestionAnsweringOutput(start_logits=start_logits, answerable_logits=answerable.squeeze(-1))
        if start_positions is not None and end_positions is not None:
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            out.end_logits = self.end_logits(hidden[rows, start_positions][:, None], hidden, penalty)[:, 0]
            loss = (F.cross_entropy(start_logits, start_positions) + F.cross_entropy(out.end_logits, end_positions)) / 2
            if is_impossible is not None:
                loss = loss + ANSWERABLE_WEIGHT * F.binary_cross_entropy_with_logits(out.answerable_logits,
                                                                                     is_impossible.float())
            out.loss = loss
            return out
        k = min(beam, hidden.shape[1])
        out.start_top_log_probs, out.start_top_index = start_logits.log_softmax(-1).topk(k)
        states = hidden.gather(1, out.start_top_index[..., None].expand(-1, -1, hidden.shape[-1]))
        out.end_top_log_probs, out.end_top_index = self.end_logits(states, hidden, penalty).log_softmax(-1).topk(k)
        return out
