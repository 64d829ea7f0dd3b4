"""Flattened (padding-free) inputs as a user can give them: each one either gives what the same rows give in a
batch of their own (a flattened row's sequences as padded rows, a padded row alone or beside another), or is
refused with one line naming the field (`convattn.flattened_inputs.flattened_sequences` has the rule)."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny import randomize_, tiny_config

from convattn import ConvAttnForMaskedLM, ConvAttnForSequenceClassification, ConvAttnForTokenClassification

# absolute position embeddings, relative terms without them, ConvBERT's span convolution (absolute positions too)
PRESETS = ["chang2021-small/absolute", "chang2021-small/composite", "convbert/small"]
LENGTHS = [5, 3, 4]


@pytest.fixture(scope="module")
def models():
    """preset -> {"encoder", "mlm", "classifier", "tagger"}: tiny float32 models in eval mode, built once."""
    built = {}

    def get(preset: str) -> dict:
        if preset not in built:
            heads = {"mlm": ConvAttnForMaskedLM, "classifier": ConvAttnForSequenceClassification,
                     "tagger": ConvAttnForTokenClassification}
            built[preset] = {}
            for name, cls in heads.items():
                torch.manual_seed(0)
                model = cls(tiny_config(preset, num_labels=3))
                randomize_(model)
                built[preset][name] = model.eval()
            built[preset]["encoder"] = built[preset]["mlm"].convattn
        return built[preset]

    return get


def token_ids(lengths=LENGTHS, seed=1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 101, (length,), generator=generator) for length in lengths]


def flat_row(lengths=LENGTHS) -> dict:
    """transformers' flattened layout of sequences of `lengths`: one row, position_ids restarting at 0."""
    return dict(input_ids=torch.cat(token_ids(lengths))[None],
                position_ids=torch.cat([torch.arange(length) for length in lengths])[None])


def with_offsets(row: dict, dtype=torch.int32) -> dict:
    lengths = torch.tensor(LENGTHS)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(dtype)
    return dict(row, cu_seq_lens_q=offsets, cu_seq_lens_k=offsets, max_length_q=max(LENGTHS),
                max_length_k=max(LENGTHS))


def positions(*values) -> torch.Tensor:
    return torch.tensor([values])


def replace(**fields):
    return lambda row, config: dict(row, **fields)


def two_rows(row: dict) -> dict:
    return {key: torch.cat([value, value]) for key, value in row.items()}


# (case, head, how the flattened row of LENGTHS (n = 12) is changed, what the one-line error must match)
REFUSED = [
    ("position_ids shorter than the row", "encoder", replace(position_ids=torch.arange(11)[None]),
     r"position_ids must have the input's shape \(1, 12\); got \(1, 11\)"),
    ("position_ids longer than the row", "encoder", replace(position_ids=torch.arange(13)[None]),
     r"position_ids must have the input's shape \(1, 12\); got \(1, 13\)"),
    ("float position_ids", "encoder", lambda row, config: dict(row, position_ids=row["position_ids"].float()),
     "position_ids must hold integers; got torch.float32"),
    ("negative position_ids", "encoder", replace(position_ids=positions(-1, *range(11))),
     "position_ids must be >= 0; got -1"),
    ("a repeated position", "encoder", replace(position_ids=positions(0, 1, 2, 2, 3, 0, 1, 2, 0, 1, 2, 3)),
     "position_ids must rise by 1 within a sequence and restart at 0 to begin the next one; token 3 of row 0 has "
     "position 2 after 2"),
    ("a position decreasing to 1", "encoder", replace(position_ids=positions(0, 1, 2, 3, 4, 1, 2, 3, 0, 1, 2, 3)),
     "position_ids must rise by 1 within a sequence and restart at 0"),
    ("a position jumping up", "encoder", replace(position_ids=positions(0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 7, 8)),
     "position_ids must rise by 1 within a sequence and restart at 0"),
    ("position_ids restarting in a batch of two rows", "encoder", lambda row, config: two_rows(row),
     "position_ids restart at 0 inside a row of a batch of 2 rows: a flattened batch is one row"),
    ("a row of zeros in a batch of two rows", "encoder",
     lambda row, config: two_rows(dict(row, position_ids=torch.zeros(1, 12, dtype=torch.long))),
     "position_ids restart at 0 inside a row of a batch of 2 rows"),
    ("a flattened row with padding", "encoder",
     lambda row, config: dict(row, attention_mask=(torch.arange(12) < 10).long()[None]),
     "a flattened batch has no padding: its attention_mask must be all ones or None"),
    ("token_type_ids shorter than the row", "encoder", replace(token_type_ids=torch.zeros(1, 11, dtype=torch.long)),
     r"token_type_ids must have the input's shape \(1, 12\)"),
    ("an attention_mask of another shape", "encoder", replace(attention_mask=torch.ones(12)),
     r"attention_mask must have the input's shape \(1, 12\)"),
    ("float cu_seq_lens_q", "encoder", lambda row, config: with_offsets(row, torch.float32),
     "cu_seq_lens_q must hold integer offsets"),
    ("an empty cu_seq_lens_q", "encoder",
     replace(cu_seq_lens_q=torch.zeros(0, dtype=torch.int32)), r"cu_seq_lens_q must rise from 0 .*got \[\]"),
    ("cu_seq_lens_q short of the row", "encoder",
     replace(cu_seq_lens_q=torch.tensor([0, 5, 8])), "cu_seq_lens_q must rise from 0 to the flattened row's 12"),
    ("cu_seq_lens_q not rising", "encoder",
     replace(cu_seq_lens_q=torch.tensor([0, 5, 5, 12])), "cu_seq_lens_q must rise from 0"),
    ("cu_seq_lens_q in a batch of two rows", "encoder",
     lambda row, config: dict(two_rows(dict(row, position_ids=torch.arange(12)[None])),
                              cu_seq_lens_q=torch.tensor([0, 12])), "cu_seq_lens_q must rise from 0 .* batch of one"),
    ("cu_seq_lens_k unlike cu_seq_lens_q", "encoder",
     lambda row, config: dict(with_offsets(row), cu_seq_lens_k=torch.tensor([0, 6, 8, 12])),
     "cu_seq_lens_k must equal cu_seq_lens_q"),
    ("cu_seq_lens_q and position_ids disagreeing", "encoder",
     lambda row, config: dict(with_offsets(row), position_ids=positions(*range(6), 0, 1, 0, 1, 2, 3)),
     r"cu_seq_lens_q and position_ids disagree on where sequences start: cu_seq_lens_q at \[0, 5, 8\]"),
    ("max_length_q 0", "encoder", lambda row, config: dict(with_offsets(row), max_length_q=0, max_length_k=0),
     "max_length_q must be the longest sequence's length, 5 here; got 0"),
    ("max_length_q above the longest", "encoder",
     lambda row, config: dict(with_offsets(row), max_length_q=12, max_length_k=12),
     "max_length_q must be the longest sequence's length, 5 here; got 12"),
    ("a float max_length_q", "encoder", lambda row, config: dict(with_offsets(row), max_length_q=5.0, max_length_k=5.0),
     "max_length_q must be one integer; got 5.0"),
    ("max_length_q without cu_seq_lens_q", "encoder", replace(max_length_q=5),
     "max_length_q describes the offsets cu_seq_lens_q"),
    ("max_length_k unlike max_length_q", "encoder", lambda row, config: dict(with_offsets(row), max_length_k=4),
     "max_length_k must equal max_length_q"),
    ("one-dimensional position_ids shorter than the row", "encoder", replace(position_ids=torch.arange(11)),
     r"position_ids must have the input's shape \(1, 12\); got \(11,\)"),
    ("bool position_ids", "encoder", lambda row, config: dict(row, position_ids=row["position_ids"].bool()),
     "position_ids must hold integers; got torch.bool"),
    ("complex token_type_ids", "encoder", replace(token_type_ids=torch.zeros(1, 12, dtype=torch.complex64)),
     "token_type_ids must hold integers; got torch.complex64"),
    ("a max_length_q of two numbers", "encoder",
     lambda row, config: dict(with_offsets(row), max_length_q=torch.tensor([5, 5])),
     r"max_length_q must be one integer; got a torch.int64 tensor of shape \(2,\)"),
    ("a bool max_length_q", "encoder",
     lambda row, config: dict(with_offsets(row), max_length_q=True, max_length_k=True),
     "max_length_q must be one integer; got True"),
    ("cu_seq_lens_k without cu_seq_lens_q", "encoder", replace(cu_seq_lens_k=torch.tensor([0, 5, 8, 12])),
     "cu_seq_lens_k must equal cu_seq_lens_q"),
    ("max_length_k without max_length_q", "encoder", lambda row, config: dict(with_offsets(row), max_length_q=None),
     "max_length_k must equal max_length_q"),
    ("offsets with padding", "encoder",
     lambda row, config: dict({k: v for k, v in with_offsets(row).items() if k != "position_ids"},
                              attention_mask=(torch.arange(12) < 10).long()[None]),
     "a flattened batch has no padding: its attention_mask must be all ones or None"),
    ("offsets of one sequence with padding", "encoder",
     replace(position_ids=torch.arange(12)[None], cu_seq_lens_q=torch.tensor([0, 12]),
             attention_mask=(torch.arange(12) < 10).long()[None]),
     "a flattened batch has no padding: its attention_mask must be all ones or None"),
    ("bool cu_seq_lens_q", "encoder", replace(cu_seq_lens_q=torch.ones(4, dtype=torch.bool)),
     "cu_seq_lens_q must hold integer offsets"),
    ("a broken position in the second row, one attention_mask row for both", "encoder",
     lambda row, config: dict(input_ids=torch.cat([row["input_ids"]] * 2), attention_mask=torch.ones(1, 12),
                              position_ids=torch.stack([torch.arange(12), torch.tensor([0, 1, 2, 2, *range(3, 11)])])),
     "token 3 of row 1 has position 2 after 2"),
    ("token labels shorter than the row", "mlm", replace(labels=torch.zeros(1, 11, dtype=torch.long)),
     r"labels must hold one label per token, the input's shape \(1, 12\)"),
    ("token labels of a token classifier longer than the row", "tagger",
     replace(labels=torch.zeros(1, 13, dtype=torch.long)), r"labels must hold one label per token.*got \(1, 13\)"),
    ("float token labels", "mlm", replace(labels=torch.zeros(1, 12)), "labels must be integer class indices"),
    ("a label per row, not per sequence", "classifier", replace(labels=torch.tensor([1])),
     r"labels must hold one label per sequence, shape \(3,\) for the 3 sequences of this flattened batch"),
    ("a label too many", "classifier", replace(labels=torch.tensor([1, 0, 2, 1])),
     r"labels must hold one label per sequence, shape \(3,\)"),
    ("float class labels", "classifier", replace(labels=torch.tensor([1.0, 0.0, 2.0])),
     "labels must be integer class indices"),
]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize(("head", "change", "message"), [pytest.param(*case[1:], id=case[0]) for case in REFUSED])
def test_a_wrong_flattened_input_is_refused_in_one_line_naming_its_field(models, preset, head, change, message):
    model = models(preset)[head]
    with pytest.raises(ValueError, match=message) as refused, torch.no_grad():
        model(**change(flat_row(), model.config))
    assert "\n" not in str(refused.value)


def padded_rows(sequences: list[torch.Tensor], pad_positions: int = 0) -> dict:
    """Each sequence a right-padded row, positions 0, 1, ... and `pad_positions` at the pads."""
    n = max(len(s) for s in sequences)
    batch = dict(input_ids=torch.zeros(len(sequences), n, dtype=torch.long),
                 attention_mask=torch.zeros(len(sequences), n, dtype=torch.long),
                 position_ids=torch.full((len(sequences), n), pad_positions))
    for row, s in enumerate(sequences):
        batch["input_ids"][row, : len(s)], batch["attention_mask"][row, : len(s)] = s, 1
        batch["position_ids"][row, : len(s)] = torch.arange(len(s))
    return batch


def real_tokens(batch: dict, hidden: torch.Tensor) -> torch.Tensor:
    keep = batch.get("attention_mask", torch.ones(hidden.shape[:2], dtype=torch.long))
    return hidden[keep.expand(hidden.shape[:2]).bool()]


def beside(row: dict, other: dict) -> dict:
    """A batch of two rows: `row` and `other`, padded with 0s to the same length (positions 0 at the pads)."""
    n = max(row["input_ids"].shape[1], other["input_ids"].shape[1])

    def pad(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, n - x.shape[1]))

    keep = [r.get("attention_mask", torch.ones_like(r["input_ids"])) for r in (row, other)]
    return {key: torch.cat([pad(row[key]), pad(other[key])]) for key in ("input_ids", "position_ids")} | {
        "attention_mask": torch.cat([pad(k) for k in keep])}


def alone(ids, position_ids, attention_mask=None) -> dict:
    batch = dict(input_ids=ids[None], position_ids=position_ids[None])
    return batch if attention_mask is None else dict(batch, attention_mask=attention_mask[None])


SEVEN = token_ids([7], seed=3)[0]
FOUR = token_ids([4], seed=4)[0]
ONE_ROW = alone(SEVEN, torch.arange(7))
AT_THREE = alone(SEVEN, torch.arange(7) + 3)
REAL_FIVE = torch.tensor([1, 1, 1, 1, 1, 0, 0])
# (case, the batch of one, the batch of several rows holding the same sequences; compared at their real tokens,
# the batch of several trimmed to the batch of one's real tokens)
SAME_ROWS = [
    ("consecutive positions from 0, beside a shorter row", ONE_ROW, beside(ONE_ROW, alone(FOUR, torch.arange(4)))),
    ("consecutive positions from 3", AT_THREE, beside(AT_THREE, alone(FOUR, torch.arange(4) + 3))),
    ("pads at any position", alone(SEVEN, torch.tensor([0, 1, 2, 3, 4, 1, 1]), REAL_FIVE),
     beside(alone(SEVEN, torch.tensor([0, 1, 2, 3, 4, 1, 1]), REAL_FIVE), ONE_ROW)),
    ("pads at position 0", alone(SEVEN, torch.tensor([0, 1, 2, 3, 4, 0, 0]), REAL_FIVE),
     beside(alone(SEVEN, torch.tensor([0, 1, 2, 3, 4, 0, 0]), REAL_FIVE), ONE_ROW)),
    ("a flattened row against its sequences as padded rows", flat_row(), padded_rows(token_ids())),
    ("a flattened row with int64 offsets", with_offsets(flat_row(), torch.int64), padded_rows(token_ids())),
    ("offsets alone", {k: v for k, v in with_offsets(flat_row()).items() if k != "position_ids"},
     padded_rows(token_ids())),
    ("a flattened row whose first sequence starts at 2",
     dict(flat_row([3, 4]), position_ids=positions(2, 3, 4, 0, 1, 2, 3)),
     dict(padded_rows(token_ids([3, 4]), pad_positions=1), position_ids=torch.tensor([[2, 3, 4, 1], [0, 1, 2, 3]]))),
    ("a row of zeros: one-token sequences", flat_row([1, 1, 1, 1]), padded_rows(token_ids([1, 1, 1, 1]))),
    ("a pad inside the row, the positions going on past it",
     alone(SEVEN, torch.tensor([0, 1, 2, 9, 3, 4, 5]), torch.tensor([1, 1, 1, 0, 1, 1, 1])),
     beside(alone(SEVEN, torch.tensor([0, 1, 2, 9, 3, 4, 5]), torch.tensor([1, 1, 1, 0, 1, 1, 1])), ONE_ROW)),
]


def hidden_of(model, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).last_hidden_state


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize(("one", "several"), [pytest.param(*case[1:], id=case[0]) for case in SAME_ROWS])
def test_the_same_rows_give_the_same_outputs_in_a_batch_of_one_and_of_several(models, preset, one, several):
    model = models(preset)["encoder"]
    ours = real_tokens(one, hidden_of(model, one))
    theirs = real_tokens(several, hidden_of(model, several))[: len(ours)]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", PRESETS)
def test_positions_past_the_embeddings_are_refused_only_where_they_are_embedded(models, preset):
    model = models(preset)["encoder"]
    limit = model.config.max_position_embeddings
    row = alone(SEVEN, torch.arange(7) + limit - 6)  # the last position is the first past the embeddings
    if model.max_position is not None:
        message = f"position_ids must be < max_position_embeddings={limit} .*got {limit}"
        with pytest.raises(ValueError, match=message):
            hidden_of(model, row)
        return
    several = beside(row, alone(FOUR, torch.arange(4)))
    torch.testing.assert_close(hidden_of(model, row)[0], hidden_of(model, several)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_losses_of_a_flattened_batch_are_the_padded_batchs(models, preset):
    """Token labels flattened with the tokens (masked LM), one label per sequence (classification)."""
    heads = models(preset)
    sequences = token_ids()
    token_labels = [torch.where(torch.arange(len(s)) % 2 == 0, s, -100) for s in sequences]
    flat, padded = flat_row(), padded_rows(sequences)
    padded_labels = torch.full(padded["input_ids"].shape, -100)
    for row, labels in enumerate(token_labels):
        padded_labels[row, : len(labels)] = labels
    classes = torch.tensor([2, 0, 1])
    with torch.no_grad():
        for head, flat_labels, row_labels in [("mlm", torch.cat(token_labels)[None], padded_labels),
                                              ("classifier", classes, classes)]:
            torch.testing.assert_close(heads[head](**flat, labels=flat_labels).loss,
                                       heads[head](**padded, labels=row_labels).loss, rtol=1e-5, atol=1e-5)
