"""transformers' attention interface: `attn_implementation` at load time and `set_attn_implementation` at run
time choose how every mechanism computes attention, read at each forward; configs saved with the field's old
name, `attention_backend`, still load."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny import randomize_, tiny_config

from convattn import ConvAttnConfig, ConvAttnModel
from convattn.attention.relative import dispatch
from convattn.electra import ConvAttnForPreTraining


@pytest.fixture
def recorded_paths(monkeypatch):
    """The path each relative-attention call took."""
    taken = []
    original = dispatch.relative_path
    monkeypatch.setattr(dispatch, "relative_path", lambda *args: taken.append(original(*args)) or taken[-1])
    return taken


def saved_model(tmp_path, preset="chang2021-small/composite", **overrides):
    model = ConvAttnModel(tiny_config(preset, **overrides))
    randomize_(model)
    model.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("preset, overrides", [
    ("chang2021-small/composite", {}),
    ("chang2021-small/convbert", dict(relative_terms=["fixed", "dynamic_query", "dynamic_key"],
                                      position_embedding_type="none")),
])
def test_set_attn_implementation_switches_a_loaded_model_at_run_time(tmp_path, recorded_paths, preset, overrides):
    model = ConvAttnModel.from_pretrained(saved_model(tmp_path, preset, **overrides)).eval()
    assert model.config._attn_implementation == "sdpa"
    n = dispatch.CPU_DECOMPOSED_MIN_LENGTH + 45  # long enough for "sdpa" to take the decomposition on CPU
    ids = torch.randint(5, 101, (2, n), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones(2, n, dtype=torch.long)
    attention_mask[1, 200:] = 0
    with torch.no_grad():
        sdpa = model(input_ids=ids, attention_mask=attention_mask).last_hidden_state
        model.set_attn_implementation("eager")
        assert model.config._attn_implementation == "eager"
        eager = model(input_ids=ids, attention_mask=attention_mask).last_hidden_state
    assert recorded_paths == ["decomposed"] * 2 + ["dense"] * 2  # two layers each
    real = attention_mask.bool()
    torch.testing.assert_close(eager[real], sdpa[real], rtol=0, atol=1e-6)


def test_set_attn_implementation_reaches_the_electra_generator():
    config = tiny_config("convbert/small", mask_token_id=4, relative_terms=["fixed"])
    model = ConvAttnForPreTraining(config)
    model.set_attn_implementation("eager")
    assert model.convattn.config._attn_implementation == "eager"
    assert model.generator.config._attn_implementation == "eager"
    attention = model.generator.encoder.layer[0].attention.self
    assert attention.config is model.generator.config


def test_from_pretrained_attn_implementation_wins(tmp_path, recorded_paths):
    path = saved_model(tmp_path)
    model = ConvAttnModel.from_pretrained(path, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    assert model.encoder.layer[0].attention.self.config is model.config
    assert ConvAttnModel.from_pretrained(path).config._attn_implementation == "sdpa"
    model(input_ids=torch.ones(1, 5, dtype=torch.long))
    assert recorded_paths == ["dense", "dense"]


def test_legacy_attention_backend_still_loads(tmp_path):
    path = saved_model(tmp_path)
    config_file = path / "config.json"
    fields = json.loads(config_file.read_text())
    assert "attention_backend" not in fields  # one name: only transformers' attn_implementation is saved
    config_file.write_text(json.dumps({**fields, "attention_backend": "eager"}))
    assert ConvAttnModel.from_pretrained(path).config._attn_implementation == "eager"
    assert ConvAttnModel.from_pretrained(path, attn_implementation="sdpa").config._attn_implementation == "sdpa"
    assert not hasattr(ConvAttnConfig.from_pretrained(path), "attention_backend")


def test_unknown_attn_implementation_is_named():
    with pytest.raises(ValueError, match=r"attn_implementation='flash'.*'sdpa', 'eager'"):
        ConvAttnConfig(attn_implementation="flash")
    with pytest.raises(ValueError, match=r"attention_backend='flash'.*'sdpa', 'eager'"):
        ConvAttnConfig(attention_backend="flash")
