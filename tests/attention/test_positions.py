"""Rotary positions and ALiBi (position_embedding_type "rotary" and "alibi") in whole models: no parameter of their
own, every mechanism they compose with, and a flattened batch equal to each sequence run alone."""

from __future__ import annotations

import json
import warnings

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
    from convattn.attention import composite

    built = model("rotary", "alone")
    rotated = []
    original = composite.turned_projections  # rotary alone: the projections in pair order, turned

    def recorded(*args):
        rotated.append(original(*args)[0])
        return original(*args)

    monkeypatch.setattr(composite, "turned_projections", recorded)
    assert_same_when_shifted(built)
    layers = TINY["num_hidden_layers"]
    assert len(rotated) == 2 * layers and (rotated[0] - rotated[layers]).abs().max() > 1e-2


@pytest.mark.parametrize(("composed", "fields", "path"), [
    ("alone", {}, "projections"), ("composite+key", {}, "copy"), ("convbert+key", {}, "copy"),
    ("conv qkv", {}, "copy"), ("composite+key", dict(rotary_relative_terms="rotated"), "formula"),
])
def test_rotary_takes_the_pair_order_where_only_scores_read_the_turned_vectors(composed, fields, path, monkeypatch):
    """Eagerly, every layer turns its queries and keys in pair order (one complex product, the fast form): projected
    so where the projections are plain linear maps and no term reads q or k, reordered by a copy where terms read the
    projections before the turn or the projections are convolutions; the rotate-half formula where the terms read
    the turned vectors channel by channel (rotary_relative_terms "rotated")."""
    from convattn.attention import composite, rotary

    calls = {"projections": 0, "copy": 0}
    for name, module in (("projections", composite), ("copy", rotary)):
        original = getattr(module, {"projections": "turned_projections", "copy": "rotate_pairs"}[name])

        def counted(*args, name=name, original=original):
            result = original(*args)
            calls[name] += result is not None
            return result

        monkeypatch.setattr(module, original.__name__, counted)
    with torch.no_grad():
        model("rotary", composed, **fields)(torch.randint(1, TINY["vocab_size"], (2, 7)))
    layers = TINY["num_hidden_layers"]
    expected = {"projections": layers if path == "projections" else 0, "copy": 2 * layers if path == "copy" else 0}
    assert calls == expected


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


@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
def test_alibi_alone_takes_the_narrowest_band(out_of_window):
    """ALiBi without relative terms rides the decomposition's tables at reach 1 in clip mode (3 columns) whatever the
    config's reach and window say: the same scores as a wider band (the module docstring's identity), at the least
    cost: 3 columns where the reach of 8 would give 17."""
    from convattn.attention.relative.bias import RelativePositionBias

    bias = RelativePositionBias([], num_heads=4, head_dim=16, reach=8, out_of_window=out_of_window, alibi=True)
    q = torch.randn(2, 4, 11, 16)
    pieces = bias.pieces(q, q)
    assert (bias.reach, bias.clip) == (1, True) and pieces["band"].shape == (2, 4, 11, 3)


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


def test_terms_read_from_the_rotated_projections_move_with_a_shift():
    """rotary_relative_terms "rotated" (what convattn computed before 2026-11-29) is read as it says: a shift of
    every position id moves the outputs, which the default's unrotated terms leave as they were."""
    built = model("rotary", "composite+key", rotary_relative_terms="rotated")
    with pytest.raises(AssertionError):
        assert_same_when_shifted(built)


def test_rotary_relative_terms_without_what_it_changes_is_refused():
    for fields in (dict(position_embedding_type="alibi", relative_terms=["dynamic_query"]),
                   dict(position_embedding_type="rotary", relative_terms=["fixed"])):
        with pytest.raises(ValueError, match="rotary_relative_terms='rotated' has no effect"):
            ConvAttnConfig(**TINY, **fields, rotary_relative_terms="rotated")


def saved_without_the_field(tmp_path, **fields):
    """A rotary model with dynamic terms saved, its config.json rewritten as convattn wrote it before
    rotary_relative_terms existed (no such key), and its logits."""
    torch.manual_seed(0)
    saved = ConvAttnForMaskedLM(ConvAttnConfig(**TINY, position_embedding_type="rotary", **COMPOSED["composite"],
                                               **fields)).eval()
    randomize_(saved)
    saved.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config.pop("rotary_relative_terms") == saved.config.rotary_relative_terms
    (tmp_path / "config.json").write_text(json.dumps(config))
    ids = torch.randint(1, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return saved, ids, saved(ids).logits


def test_a_config_from_before_the_field_loads_as_saved_since_and_says_so(tmp_path, capsys):
    """Such a config.json was written both before 2026-11-29 (terms from the rotated projections) and after (from
    the unrotated ones), with nothing in it to tell which: it loads as the current code computes, and loading (a
    warning) and the folder check (a line on the screen, once) say how to get the other back."""
    from convattn.checkpoint import check_model_folder

    _, ids, logits = saved_without_the_field(tmp_path)
    with pytest.warns(UserWarning, match='add "rotary_relative_terms": "rotated" to its config.json'):
        loaded = ConvAttnForMaskedLM.from_pretrained(tmp_path).eval()
    assert loaded.config.rotary_relative_terms == "unrotated"
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, logits)
    capsys.readouterr()
    with pytest.warns(UserWarning):
        check_model_folder(tmp_path)
        check_model_folder(tmp_path)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("convattn")]
    assert len(said) == 1 and said[0].startswith(f"convattn: warning: {tmp_path / 'config.json'}: config.json has "
                                                 "rotary positions beside dynamic relative terms")
    # the field written as the line says brings back a model saved before the field existed
    _, _, rotated_logits = saved_without_the_field(tmp_path, rotary_relative_terms="rotated")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "rotary_relative_terms": "rotated"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = ConvAttnForMaskedLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(again(ids).logits, rotated_logits)
    assert not torch.allclose(rotated_logits, logits, atol=1e-4)


@pytest.mark.parametrize(("kind", "composed"), [("rotary", "alone"), ("rotary", "composite"), ("alibi", "composite")])
def test_configs_the_field_does_not_change_load_without_a_word(kind, composed, tmp_path):
    ConvAttnForMaskedLM(ConvAttnConfig(**TINY, position_embedding_type=kind, **COMPOSED[composed])).save_pretrained(
        tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    if kind != "rotary" or composed == "alone":  # predating the field: said only where it changes the outputs
        config.pop("rotary_relative_terms")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ConvAttnForMaskedLM.from_pretrained(tmp_path)
