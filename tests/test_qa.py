"""ELECTRA's joint QA head against explicit loops in float64, and the QA model with each head."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.tiny import randomize_, tiny_config, tiny_wordpiece_tokenizer

from convattn import ConvAttnConfig
from convattn.model import ConvAttnForQuestionAnswering
from convattn.qa import JointSpanHead, default_answer_mask, span_candidates

# ELECTRA's qa_tasks.py: answer-mask logits -1000, the answerable loss weighed 0.5 (literals here, not the module's
# constants, so that a changed constant fails)
MASK_PENALTY, ANSWERABLE_WEIGHT = 1000.0, 0.5


def gelu(x: float) -> float:
    return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))


def dense(layer: torch.nn.Linear, x: list[float]) -> list[float]:
    return [sum(w * v for w, v in zip(row, x, strict=True)) + b
            for row, b in zip(layer.weight.tolist(), layer.bias.tolist(), strict=True)]


def reference(head: JointSpanHead, hidden: torch.Tensor, mask: torch.Tensor):
    """Per example: start logits, end logits for every start (n x n), answerable logit; plain Python."""
    results = []
    for h, m in zip(hidden.tolist(), mask.tolist(), strict=True):
        penalty = [0.0 if keep else -MASK_PENALTY for keep in m]
        start = [dense(head.start, hi)[0] + p for hi, p in zip(h, penalty, strict=True)]
        end = [[dense(head.end, [gelu(v) for v in dense(head.end_hidden, h[s] + hj)])[0] + p
                for hj, p in zip(h, penalty, strict=True)] for s in range(len(h))]
        top = max(start)
        weights = [math.exp(v - top) for v in start]
        pooled = [sum(w * hi[c] for w, hi in zip(weights, h, strict=True)) / sum(weights) for c in range(len(h[0]))]
        answerable = dense(head.answerable, [gelu(v) for v in dense(head.answerable_hidden, h[0] + pooled)])[0]
        results.append((start, end, answerable))
    return results


def log_softmax(values: list[float]) -> list[float]:
    top = max(values)
    total = math.log(sum(math.exp(v - top) for v in values)) + top
    return [v - total for v in values]


@pytest.fixture
def head_and_inputs():
    torch.manual_seed(0)
    head = JointSpanHead(6).double()
    randomize_(head)
    hidden = torch.randn(3, 9, 6, dtype=torch.float64)
    attention = torch.ones(3, 9, dtype=torch.long)
    attention[1, 6:] = 0  # padding
    types = torch.zeros(3, 9, dtype=torch.long)
    types[:, 3:] = 1      # [CLS] q q [SEP] context ...
    return head, hidden, default_answer_mask(attention, types, (3, 9))


def test_default_answer_mask_is_context_and_cls():
    attention = torch.tensor([[1, 1, 1, 1, 1, 0]])
    types = torch.tensor([[0, 0, 0, 1, 1, 1]])
    assert default_answer_mask(attention, types, (1, 6)).tolist() == [[True, False, False, True, True, False]]


def test_training_loss_matches_the_loops(head_and_inputs):
    head, hidden, mask = head_and_inputs
    starts, ends, impossible = torch.tensor([4, 0, 7]), torch.tensor([6, 0, 8]), torch.tensor([0, 1, 0])
    out = head(hidden, mask, starts, ends, impossible)
    expected = 0.0
    for b, (start, end, answerable) in enumerate(reference(head, hidden, mask)):
        s, e = int(starts[b]), int(ends[b])
        span = -(log_softmax(start)[s] + log_softmax(end[s])[e]) / 2
        label = float(impossible[b])
        bce = max(answerable, 0) - answerable * label + math.log1p(math.exp(-abs(answerable)))
        expected += (span + ANSWERABLE_WEIGHT * bce) / len(starts)
        torch.testing.assert_close(out.end_logits[b], torch.tensor(end[s], dtype=torch.float64))
    torch.testing.assert_close(out.loss, torch.tensor(expected, dtype=torch.float64))


def test_prediction_beam_matches_the_loops(head_and_inputs):
    head, hidden, mask = head_and_inputs
    beam = 4
    out = head(hidden, mask, beam=beam)
    for b, (start, end, answerable) in enumerate(reference(head, hidden, mask)):
        start_lp = log_softmax(start)
        top = sorted(range(len(start)), key=lambda i: -start_lp[i])[:beam]
        assert out.start_top_index[b].tolist() == top
        torch.testing.assert_close(out.start_top_log_probs[b], torch.tensor([start_lp[i] for i in top],
                                                                            dtype=torch.float64))
        for i, s in enumerate(top):
            end_lp = log_softmax(end[s])
            best = sorted(range(len(end_lp)), key=lambda j: -end_lp[j])[:beam]
            assert out.end_top_index[b, i].tolist() == best
            torch.testing.assert_close(out.end_top_log_probs[b, i], torch.tensor([end_lp[j] for j in best],
                                                                                 dtype=torch.float64))
        assert out.answerable_logits[b].item() == pytest.approx(answerable)
        # end_logits: the end given the most likely start, ends before that start masked
        s = top[0]
        expected_end = [v - MASK_PENALTY * (j < s) for j, v in enumerate(end[s])]
        torch.testing.assert_close(out.end_logits[b], torch.tensor(expected_end, dtype=torch.float64))
        assert out.end_logits[b].argmax() >= out.start_logits[b].argmax()


def test_candidates_pair_each_start_with_its_own_ends():
    """The joint head's beam: start i's log-probability plus the log-probability of end j given start i."""
    from types import SimpleNamespace

    outputs = SimpleNamespace(start_top_index=torch.tensor([[3, 5]]), start_top_log_probs=torch.tensor([[-0.1, -2.0]]),
                              end_top_index=torch.tensor([[[4, 6], [7, 5]]]),
                              end_top_log_probs=torch.tensor([[[-0.5, -1.5], [-0.2, -3.0]]]))
    got = span_candidates(outputs, 0)
    expected = [(-0.6, 3, 4), (-1.6, 3, 6), (-2.2, 5, 7), (-5.0, 5, 5)]
    assert [(s, e) for _, s, e in got] == [(s, e) for _, s, e in expected]
    assert [lp for lp, _, _ in got] == pytest.approx([lp for lp, _, _ in expected])


def test_the_model_takes_either_head():
    ids = torch.randint(5, 101, (2, 11))
    types = torch.zeros_like(ids)
    types[:, 4:] = 1
    span = ConvAttnForQuestionAnswering(tiny_config("chang2021-small/composite")).eval()
    joint = ConvAttnForQuestionAnswering(tiny_config("chang2021-small/composite", qa_head="joint")).eval()
    assert span(input_ids=ids, token_type_ids=types).start_logits.shape == (2, 11)
    out = joint(input_ids=ids, token_type_ids=types)
    assert out.start_top_index.shape == (2, 11) and out.end_top_index.shape == (2, 11, 11)
    for row in out.start_top_index[:, :8].tolist():  # the 8 answer positions ([CLS] and context) rank first
        assert sorted(row) == [0, 4, 5, 6, 7, 8, 9, 10]
    with pytest.raises(ValueError, match="qa_head"):
        ConvAttnConfig(qa_head="beam")


CONTEXT = ("the cat sat on the mat while the dog ran in the park . later the bird sang a song in the old tree "
           "and the children played near the river until the sun went down .")


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_wordpiece_tokenizer([CONTEXT, "who sat on the mat ?", "where did the dog run ?"] * 20, vocab_size=120)


@pytest.mark.parametrize("head", ["span", "joint"])
def test_answer_reads_the_best_span_of_the_context(tokenizer, head):
    torch.manual_seed(0)
    config = tiny_config("chang2021-small/composite", qa_head=head, vocab_size=len(tokenizer),
                         pad_token_id=tokenizer.pad_token_id)
    model = ConvAttnForQuestionAnswering(config).eval()
    randomize_(model)
    question = "where did the dog run ?"
    result = model.answer(question, CONTEXT, tokenizer=tokenizer)
    assert set(result) == {"answer", "score", "start", "end"} and 0 < result["score"] <= 1
    assert result["answer"] and CONTEXT[result["start"]:result["end"]] == result["answer"]

    # one window holding the whole context: the answer is the best-scoring span inside the context
    encoded = tokenizer(question, CONTEXT, return_offsets_mapping=True, return_tensors="pt")
    offsets = encoded.pop("offset_mapping")[0].tolist()
    with torch.no_grad():
        outputs = model(**encoded)
    context = [i for i, sequence in enumerate(encoded.sequence_ids(0)) if sequence == 1]
    log_prob, s, e = max((lp, s, e) for lp, s, e in span_candidates(outputs, 0)
                         if s in context and e in context and s <= e < s + 30)
    assert model.answer(question, CONTEXT, tokenizer=tokenizer, max_length=200) == pytest.approx(
        {"answer": CONTEXT[offsets[s][0]:offsets[e][1]], "score": math.exp(log_prob), "start": offsets[s][0],
         "end": offsets[e][1]})

    # a context longer than one window is read in overlapping windows
    windows = tokenizer(question, CONTEXT, truncation="only_second", max_length=24, stride=8,
                        return_overflowing_tokens=True)
    assert len(windows["input_ids"]) > 2
    short = model.answer(question, CONTEXT, tokenizer=tokenizer, max_length=24)
    assert short["answer"] and CONTEXT[short["start"]:short["end"]] == short["answer"]
