"""The models' losses and the checks of their labels: the masked-LM loss (run on the scored positions only, with a
fixed-shape variant for torch.compile), the task heads' losses, and label checks that name what a batch should
hold instead of failing inside a cross-entropy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def check_token_labels(labels: Tensor, shape: torch.Size) -> None:
    """One class index per token (-100 where unscored), the input's shape."""
    # dimension by dimension: under torch.compile the sizes may be symbols
    if labels.dim() != len(shape) or not all(a == b for a, b in zip(labels.shape, shape, strict=True)):
        raise ValueError(f"labels must hold one label per token, the input's shape {tuple(shape)} (-100 where "
                         f"unscored); got {tuple(labels.shape)}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer class indices (-100 where unscored); got {labels.dtype}")


def check_something_masked(labels: Tensor, input_ids: Tensor) -> None:
    """Masked-LM training hides what it scores: labels that are the input itself at every scored position, with most
    tokens scored, train the model to copy its input. transformers' DataCollatorWithFlattening makes such labels for
    the flattened batches it builds (where this is checked)."""
    scored = labels != -100
    if 2 * int(scored.sum()) > labels.numel() and torch.equal(labels[scored], input_ids[scored]):
        raise ValueError("labels equal input_ids at every scored position and no token is masked, so masked-LM "
                         "training would learn to copy its input; mask the batch with convattn.data.flattening."
                         "FlatteningCollator(masking=DataCollatorForLanguageModeling(tokenizer)) (flattened) or "
                         "DataCollatorForLanguageModeling(tokenizer) itself (padded)")


def check_sequence_labels(labels: Tensor, logits: Tensor, multi_label: bool, flattened: bool) -> None:
    """One label per sequence (a row of 0/1 targets for multi-label classification); class indices are integers."""
    count = logits.shape[0]
    if multi_label:
        fits, expected = tuple(labels.shape) == tuple(logits.shape), tuple(logits.shape)
    else:
        fits, expected = labels.dim() >= 1 and labels.shape[0] == labels.numel() == count, (count,)
    if not fits:
        where = "sequences of this flattened batch" if flattened else "rows of this batch"
        collator = ("; transformers' DataCollatorWithFlattening gives token labels, while "
                    "convattn.data.flattening.FlatteningCollator keeps one per sequence") if flattened else ""
        raise ValueError(f"labels must hold one label per sequence, shape {expected} for the {count} {where}; "
                         f"got {tuple(labels.shape)}{collator}")
    if logits.shape[-1] > 1 and not multi_label and (labels.is_floating_point() or labels.dtype == torch.bool):
        raise ValueError(f"labels must be integer class indices; got {labels.dtype}")


MLM_REDUCTIONS = ("mean", "sum", "per_example")


def scored_rows_bound(positions: int) -> int:
    """The rows the MLM head runs on under torch.compile: a quarter of the batch's positions, which holds the
    scored ones of any batch masked at BERT's 15 % but the rarest (`fixed_shape_masked_lm_loss`)."""
    return positions // 4 + 1


def masked_lm_loss(head: nn.Module, hidden_states: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy (float32) of `head`'s vocabulary logits at the positions whose label is not -100; the head
    only runs on those positions. reduction: "mean" over the scored tokens, "sum", or "per_example" (the sum
    over each row of `labels`, shape (batch,), float64 so that sums over a whole eval set stay exact). Under
    torch.compile: `fixed_shape_masked_lm_loss`, the same loss."""
    if reduction not in MLM_REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not allowed; choose one of 'mean', 'sum', 'per_example'")
    if torch.compiler.is_compiling():
        return fixed_shape_masked_lm_loss(head, hidden_states, labels, reduction)
    scored = labels != -100
    token_loss = F.cross_entropy(head(hidden_states[scored]).float(), labels[scored], reduction="none")
    if reduction == "mean":
        return token_loss.mean()
    if reduction == "sum":
        return token_loss.sum()
    return reduced_token_loss(token_loss, scored.nonzero()[:, 0], labels.shape[0], reduction)


def fixed_shape_masked_lm_loss(head: nn.Module, hidden_states: Tensor, labels: Tensor, reduction: str) -> Tensor:
    """`masked_lm_loss` with every shape known before the data, for torch.compile (selecting the scored rows
    has a data-dependent size, which would split the graph). The head runs on a fixed number of rows, the scored
    positions first then unscored ones (their loss 0), when that many hold every scored position; on all of
    them otherwise (`torch.cond`, a branch inside the graph). The loss is the same either way."""
    batch, n = labels.shape
    flat_labels = labels.flatten()
    scored = flat_labels != -100
    rows = scored_rows_bound(batch * n)

    # the branches read no view of an operand from outside (torch.cond refuses aliased inputs)
    def head_on_scored_rows(hidden_states: Tensor, flat_labels: Tensor) -> Tensor:
        # a stable sort of "unscored?" puts the scored positions first, in order
        positions = torch.argsort((~scored).to(torch.uint8), stable=True)[:rows]
        logits = head(hidden_states.flatten(0, -2)[positions]).float()
        token_loss = F.cross_entropy(logits, flat_labels[positions], ignore_index=-100, reduction="none")
        return reduced_token_loss(token_loss, positions // n, batch, reduction)

    def head_on_all_rows(hidden_states: Tensor, flat_labels: Tensor) -> Tensor:
        logits = head(hidden_states.flatten(0, -2)).float()
        token_loss = F.cross_entropy(logits, flat_labels, ignore_index=-100, reduction="none")
        examples = torch.arange(batch, device=flat_labels.device).repeat_interleave(n)
        return reduced_token_loss(token_loss, examples, batch, reduction)

    total = torch.cond(scored.sum() <= rows, head_on_scored_rows, head_on_all_rows, (hidden_states, flat_labels))
    return total / scored.sum() if reduction == "mean" else total


def reduced_token_loss(token_loss: Tensor, example: Tensor, batch: int, reduction: str) -> Tensor:
    """The sum of token losses ("mean", "sum"), or per example (`example`: each token's row) in float64."""
    if reduction != "per_example":
        return token_loss.sum()
    per_example = torch.zeros(batch, device=token_loss.device, dtype=torch.float64)
    return per_example.index_add(0, example, token_loss.double())


def sequence_classification_loss(logits: Tensor, labels: Tensor, num_labels: int, multi_label: bool) -> Tensor:
    """Regression (num_labels 1): MSE; multi-label classification: binary cross-entropy per label; otherwise
    cross-entropy over the classes. In float32 whatever the logits' precision."""
    if num_labels == 1:
        return F.mse_loss(logits.squeeze(-1).float(), labels.view(-1).float())
    if multi_label:
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    return F.cross_entropy(logits.float(), labels.view(-1))


def token_classification_loss(logits: Tensor, labels: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def span_loss(start_logits: Tensor, end_logits: Tensor, start_positions: Tensor, end_positions: Tensor) -> Tensor:
    """The span head's loss: the mean of the start's and the end's cross-entropy over the window's positions."""
    n = start_logits.shape[1]
    # positions outside the sequence are ignored, as in HF's QA heads
    start = start_positions.clamp(0, n).masked_fill(start_positions >= n, -100)
    end = end_positions.clamp(0, n).masked_fill(end_positions >= n, -100)
    return (F.cross_entropy(start_logits.float(), start, ignore_index=-100)
            + F.cross_entropy(end_logits.float(), end, ignore_index=-100)) / 2
