"""The losses against float64 references written out token by token (which positions count, how they are summed and
averaged, in which precision), and the label checks' boundaries."""

from __future__ import annotations

import math

import pytest
import torch

from convattn.losses import (
    MLM_REDUCTIONS,
    check_sequence_labels,
    check_something_masked,
    check_token_labels,
    fixed_shape_masked_lm_loss,
    masked_lm_loss,
    sequence_classification_loss,
    span_loss,
    token_classification_loss,
)

VOCAB = 11


def head_and_hidden(dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Linear, torch.Tensor]:
    """A vocabulary head and the hidden states of a batch of 3 rows of 10 positions."""
    generator = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(8, VOCAB)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, 8, generator=generator))
        head.bias.copy_(torch.randn(VOCAB, generator=generator))
    return head.to(dtype), torch.randn(3, 10, 8, generator=generator).to(dtype)


def mlm_labels(scored: str) -> torch.Tensor:
    """-100 where unscored; row 1 has no scored token. "few": 5 scored, within the fixed-shape path's 8 rows (a
    quarter of 30 positions, and one); "most": 16, past them."""
    labels = torch.full((3, 10), -100)
    if scored == "few":
        labels[0, [0, 3, 9]] = torch.tensor([0, 10, 4])
        labels[2, [1, 5]] = torch.tensor([0, 7])
    else:
        labels[0] = torch.arange(10) * 3 % VOCAB
        labels[2, :6] = torch.tensor([0, 10, 5, 5, 1, 2])
    return labels


def cross_entropy(logits, target: int) -> float:
    """-log softmax(logits)[target], in float64."""
    values = [float(x) for x in logits]
    top = max(values)
    return top + math.log(sum(math.exp(x - top) for x in values)) - values[target]


def binary_cross_entropy(logit: float, target: float) -> float:
    p = 1 / (1 + math.exp(-logit))
    return -(target * math.log(p) + (1 - target) * math.log(1 - p))


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.parametrize("scored", ["few", "most"])
@pytest.mark.parametrize("loss", [masked_lm_loss, fixed_shape_masked_lm_loss], ids=["eager", "fixed shape"])
@pytest.mark.parametrize("reduction", MLM_REDUCTIONS)
def test_masked_lm_loss_is_the_cross_entropy_of_every_scored_token(reduction, loss, scored):
    """Every position labelled other than -100 counts, token id 0 included (a vocabulary's first piece is a token
    like any other), and no other: per example the sum over its row (0 for a row with none, float64), "sum" the
    total and "mean" the total over the scored tokens; on both of the fixed-shape path's branches."""
    head, hidden = head_and_hidden()
    labels = mlm_labels(scored)
    with torch.no_grad():
        got = loss(head, hidden, labels, reduction)
        logits = head(hidden).double()
    rows = [sum(cross_entropy(logits[b, i], t) for i, t in enumerate(row) if t != -100)
            for b, row in enumerate(labels.tolist())]
    expected = {"per_example": torch.tensor(rows, dtype=torch.float64), "sum": torch.tensor(sum(rows)),
                "mean": torch.tensor(sum(rows) / int((labels != -100).sum()))}[reduction]
    assert got.dtype == (torch.float64 if reduction == "per_example" else torch.float32)
    torch.testing.assert_close(got.double(), expected.double(), rtol=1e-5, atol=1e-6)


def task_losses(dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, float]]:
    """Each task loss on logits of `dtype`, and its float64 reference from the same logits."""
    generator = torch.Generator().manual_seed(1)

    def logits(*shape: int) -> torch.Tensor:
        return (2 * torch.randn(*shape, generator=generator)).to(dtype)

    classes, labels = logits(4, 3), torch.tensor([0, 2, 1, 2])
    scores, targets = logits(4, 1), torch.tensor([0.5, 4.0, 2.5, -1.0])
    tags, multi = logits(4, 3), torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]])
    tokens, token_labels = logits(2, 5, 3), torch.tensor([[0, 2, -100, 1, -100], [-100, -100, 2, 2, 0]])
    start, end = logits(3, 10), logits(3, 10)
    # past the window (10 and on) ignored, below it clamped to the first position, as transformers' QA heads
    starts, ends = torch.tensor([1, 10, -3]), torch.tensor([9, 4, 25])
    c, s, t, k = classes.double(), scores.double(), tags.double(), tokens.double()
    first, last = start.double(), end.double()
    return {
        "classification": (sequence_classification_loss(classes, labels, 3, multi_label=False),
                           mean([cross_entropy(c[b], y) for b, y in enumerate(labels.tolist())])),
        "regression": (sequence_classification_loss(scores, targets, 1, multi_label=False),
                       mean([(float(s[b, 0]) - y) ** 2 for b, y in enumerate(targets.tolist())])),
        "multi-label": (sequence_classification_loss(tags, multi, 3, multi_label=True),
                        mean([binary_cross_entropy(float(t[b, j]), y) for b, row in enumerate(multi.tolist())
                              for j, y in enumerate(row)])),
        "token": (token_classification_loss(tokens, token_labels),
                  mean([cross_entropy(k[b, i], y) for b, row in enumerate(token_labels.tolist())
                        for i, y in enumerate(row) if y != -100])),
        "span": (span_loss(start, end, starts, ends),
                 (mean([cross_entropy(first[0], 1), cross_entropy(first[2], 0)])
                  + mean([cross_entropy(last[0], 9), cross_entropy(last[1], 4)])) / 2),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_task_losses_are_their_float64_references_taken_in_float32(dtype):
    """Classification: cross-entropy averaged over the rows; regression: mean squared error; multi-label: binary
    cross-entropy averaged over rows and labels; tokens: cross-entropy averaged over the labelled ones; spans: the
    mean of the start's and the end's, each over its positions inside the window. bfloat16 logits (mixed precision)
    are upcast first: a loss taken in bfloat16 (8 bits of mantissa) is off by some tenths of a percent."""
    for name, (got, expected) in task_losses(dtype).items():
        assert got.dtype == torch.float32, name
        torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: {m}")


def test_the_masked_lm_loss_of_a_bfloat16_head_is_taken_in_float32():
    """The mean over the scored tokens, from bfloat16 logits upcast before the softmax (a model run under bf16
    autocast reports this loss, and its perplexity)."""
    head, hidden = head_and_hidden(torch.bfloat16)
    labels = mlm_labels("few")
    with torch.no_grad():
        got = masked_lm_loss(head, hidden, labels)
        logits = head(hidden).double()
    expected = mean([cross_entropy(logits[b, i], t) for b, row in enumerate(labels.tolist())
                     for i, t in enumerate(row) if t != -100])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-6)


def test_a_batch_copying_its_input_is_refused_only_when_most_tokens_are_scored():
    """Half the tokens scored, each keeping its token, is a heavily masked batch (BERT keeps 10 % of its scored
    tokens); one more scored token makes most of the batch its own label."""
    ids = torch.arange(5, 25).view(2, 10)
    half = torch.where(torch.arange(10) < 5, ids, -100)
    check_something_masked(half, ids)
    most = half.clone()
    most[1, 7] = ids[1, 7]
    with pytest.raises(ValueError, match="labels equal input_ids at every scored position"):
        check_something_masked(most, ids)
    most[0, 0] = 6  # one masked token: not a copy
    check_something_masked(most, ids)


def test_labels_that_are_not_class_indices_are_refused_before_the_loss():
    """Boolean token labels, float labels of a two-class classifier, and several labels per row of a single-label
    one are refused naming what a batch should hold, instead of failing inside a cross-entropy with no word of
    labels, or, for a regression on one row, being averaged against its one output."""
    with pytest.raises(ValueError, match=r"labels must be integer class indices .* got torch\.bool"):
        check_token_labels(torch.zeros(2, 5, dtype=torch.bool), torch.Size([2, 5]))
    logits = torch.zeros(4, 2)
    with pytest.raises(ValueError, match=r"labels must be integer class indices; got torch\.float32"):
        check_sequence_labels(torch.tensor([0.0, 1.0, 1.0, 0.0]), logits, multi_label=False, flattened=False)
    with pytest.raises(ValueError, match=r"one label per sequence, shape \(4,\) for the 4 rows of this batch; "
                                         r"got \(4, 2\)"):
        check_sequence_labels(torch.zeros(4, 2, dtype=torch.long), logits, multi_label=False, flattened=False)
    with pytest.raises(ValueError, match=r"one label per sequence, shape \(1,\) for the 1 rows of this batch"):
        check_sequence_labels(torch.tensor([[0.5, 1.0, 2.0]]), torch.zeros(1, 1), multi_label=False, flattened=False)
    check_sequence_labels(torch.tensor([0.5, 1.0, 1.0, 0.0]), torch.zeros(4, 1), multi_label=False, flattened=False)
    check_sequence_labels(torch.zeros(4, 2), logits, multi_label=True, flattened=False)
