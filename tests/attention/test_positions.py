"""Rotary positions and ALiBi (position_embedding_type "rotary" and "alibi") in whole models: no parameter of their
own, every mechanism they compose with, and a flattened batch equal to each sequence run alone."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny import TINY, randomize_

from convattn import ConvAttnConfig, ConvAttnForMaskedLM, ConvAttnModel
from convattn.attention.relative import alibi_slopes

COMPOSED = {
    "alone": {},
    "composite": dict(relative_terms=["fixed", "dynamic_query"]),
    "composite+key": dict(relative_terms=["fixed", "dynamic_query", "dynamic_key"]),
    "convbert": dict(head_ratio=2),
    "convbert+key": dict(head_ratio=2, relative_terms=["fixed", "dynamic_query", "dynamic_key"]),
    "conv qkv": dict(conv_projections=["query", "key", "value"]),
    "depthwise": dict(value_depthwise_conv=True),
}


def model(kind: str, composed: str, **fields) -> ConvAttnModel:
    torch.manual_seed(0)
    config = ConvAttnConfig(**TINY, position_embedding_type=kind, **COMPOSED[composed], **fields)
    built = ConvAttnModel(config).eval()
    randomize_(built)
    return built


@pytest.mark.parametrize("composed", list(COMPOSED))
@pytest.mark.parametrize("kind", ["rotary", "alibi"])
def test_no_parameter_of_their_own(kind, composed):
    """The `none` model's parameters exactly, and nothing more in the state dict (slopes and frequencies are
    computed, not stored)."""
    ours, none = (ConvAttnForMaskedLM(ConvAttnConfig(**TINY, position_embedding_type=k, **COMPOSED[composed]))
                  for k in (kind, "none"))
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in none.parameters())
    assert ours.state_dict().keys() == none.state_dict().keys()


@pytest.mark.parametrize("composed", list(COMPOSED))
@pytest.mark.parametrize("kind", ["rotary", "alibi"])
def test_padded_and_flattened_batches_equal_each_sequence_alone(kind, composed):
    built = model(kind, composed)
    lengths = [11, 6, 1, 8]
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, TINY["vocab_size"], (len(lengths), max(lengths)), generator=generator)
    keep = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    with torch.no_grad():
        alone = [built(ids[b:b + 1, :n]).last_hidden_state[0] for b, n in enumerate(lengths)]
        padded = built(ids, attention_mask=keep).last_hidden_state
        stream = torch.cat([ids[b, :n] for b, n in enumerate(lengths)])[None]
        positions = torch.cat([torch.arange(n) for n in lengths])[None]
        flattened = built(stream, position_ids=positions).last_hidden_state[0]
    for b, n in enumerate(lengths):
        torch.testing.assert_close(padded[b, :n], alone[b], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(flattened, torch.cat(alone), rtol=1e-5, atol=1e-5)


def test_rotary_attention_depends_on_position_differences_only(monkeypatch):
    """Position ids shifted by 5 leave the outputs as they were, while the rotated queries differ: the ids given
    reach the rotation, and only their differences count."""
    from convattn.attention import rotary

    built = model("rotary", "alone")
    rotated = []
    original = rotary.rotate_queries_and_keys
    monkeypatch.setattr(rotary, "rotate_queries_and_keys", lambda *args: rotated.append(original(*args)[0])
                        or original(*args))
    assert_same_when_shifted(built)
    layers = TINY["num_hidden_layers"]
    assert len(rotated) == 2 * layers and (rotated[0] - rotated[layers]).abs().max() > 1e-2


@pytest.mark.parametrize("composed", ["composite", "composite+key", "convbert+key"])
def test_relative_terms_beside_rotary_depend_on_offsets_only(composed):
    """With dynamic relative terms the model is still translation invariant: the terms read the projections before
    the rotation (read from the turned ones, the outputs moved by about 1e-3 when every position shifted)."""
    assert_same_when_shifted(model("rotary", composed))


def assert_same_when_shifted(built: ConvAttnModel, shift: int = 5) -> None:
    ids = torch.randint(1, TINY["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        plain = built(ids).last_hidden_state
        shifted = built(ids, position_ids=torch.arange(7)[None].expand(2, 7) + shift).last_hidden_state
    torch.testing.assert_close(shifted, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("heads", "expected"), [
    (1, [2 ** -8]),
    (4, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]),
    (8, [2 ** -k for k in range(1, 9)]),
    # not a power of two: the 4 of h = 4, then the 1st and 3rd of h = 8 (2^-k)
    (6, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]),
    (12, [2 ** -k for k in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]),
])
def test_alibi_slopes_are_press_et_al(heads, expected):
    assert alibi_slopes(heads) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("kind", "fields"), [("rotary", dict(rope_theta=500.0)), ("alibi", {})])
def test_save_and_load_keep_the_outputs(kind, fields, tmp_path):
    """The folder passes convattn's checks and loads to the same logits, rope_theta included (remote code without
    convattn: tests/test_hub.py)."""
    from convattn.checkpoint import check_model_folder

    torch.manual_seed(0)
    saved = ConvAttnForMaskedLM(ConvAttnConfig(**TINY, position_embedding_type=kind, **fields)).eval()
    randomize_(saved)
    saved.save_pretrained(tmp_path)
    check_model_folder(tmp_path)
    loaded = ConvAttnForMaskedLM.from_pretrained(tmp_path).eval()
    assert loaded.config.position_embedding_type == kind and loaded.config.rope_theta == saved.config.rope_theta
    ids = torch.randint(1, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, saved(ids).logits)
