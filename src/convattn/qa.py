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

import math
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
    end_logits: Tensor | None = None            # (batch, n) given the gold start (training), else the most
                                                # likely start, positions before it masked
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
        # beam 0: the end logits of the most likely start only, no beam outputs. An exported graph takes that:
        # min(beam, length) is a branch on the length that torch.export cannot keep symbolic
        k = min(beam, hidden.shape[1]) if beam else 1
        start_top_log_probs, start_top_index = start_logits.log_softmax(-1).topk(k)
        states = hidden.gather(1, start_top_index[..., None].expand(-1, -1, hidden.shape[-1]))
        end_logits = self.end_logits(states, hidden, penalty)
        if beam:
            out.start_top_log_probs, out.start_top_index = start_top_log_probs, start_top_index
            out.end_top_log_probs, out.end_top_index = end_logits.log_softmax(-1).topk(k)
        # so that start_logits.argmax() and end_logits.argmax() read a span, as with any QA head
        before_start = torch.arange(hidden.shape[1], device=hidden.device) < start_top_index[:, :1]
        out.end_logits = end_logits[:, 0] - before_start * MASK_PENALTY
        return out


def span_candidates(outputs, window: int, beam: int = BEAM) -> list[tuple[float, int, int]]:
    """(log-probability, start, end) of the spans one window's outputs rank highest: the joint head's beam, or
    the span head's `beam` best starts with its `beam` best ends."""
    if getattr(outputs, "start_top_index", None) is not None:
        starts, ends = outputs.start_top_index[window].tolist(), outputs.end_top_index[window].tolist()
        start_lp, end_lp = outputs.start_top_log_probs[window].tolist(), outputs.end_top_log_probs[window].tolist()
        return [(start_lp[i] + end_lp[i][j], s, e) for i, s in enumerate(starts) for j, e in enumerate(ends[i])]
    k = min(beam, outputs.start_logits.shape[-1])
    start_lp, starts = outputs.start_logits[window].float().log_softmax(-1).topk(k)
    end_lp, ends = outputs.end_logits[window].float().log_softmax(-1).topk(k)
    return [(float(a + b), s, e) for a, s in zip(start_lp, starts.tolist(), strict=True)
            for b, e in zip(end_lp, ends.tolist(), strict=True)]


def answer(model, tokenizer, question: str, context: str, max_length: int | None = None,
           max_answer_length: int = 30) -> dict:
    """The most likely answer to `question` in `context`, as transformers' question-answering pipeline gave it:
    {"answer", "score" (its probability in its window), "start", "end" (character offsets in `context`)}. A long
    context is read in windows of `max_length` tokens overlapping by a third. Always a span: SQuAD 2.0's "no
    answer" is the model's `answerable_logits` (joint head) or the span at [CLS] (span head)."""
    if max_length is None:
        max_length = min(384, tokenizer.model_max_length, model.config.max_position_embeddings)
    encoded = tokenizer(question, context, truncation="only_second", max_length=max_length, stride=max_length // 3,
                        return_overflowing_tokens=True, return_offsets_mapping=True, padding=True,
                        return_tensors="pt")
    offsets = encoded.pop("offset_mapping").tolist()
    encoded.pop("overflow_to_sample_mapping", None)
    with torch.no_grad():
        outputs = model(**{name: value.to(model.device) for name, value in encoded.items()})
    best = None
    for window in range(len(offsets)):
        in_context = [sequence == 1 for sequence in encoded.sequence_ids(window)]
        for log_prob, s, e in span_candidates(outputs, window):
            if in_context[s] and in_context[e] and s <= e < s + max_answer_length and (best is None or
                                                                                       log_prob > best[0]):
                best = (log_prob, offsets[window][s][0], offsets[window][e][1])
    if best is None:
        return {"answer": "", "score": 0.0, "start": 0, "end": 0}
    log_prob, start, end = best
    text = context[start:end]
    start += len(text) - len(text.lstrip())  # metaspace tokenizers count the space before a word
    return {"answer": text.strip(), "score": math.exp(log_prob), "start": start, "end": start + len(text.strip())}
