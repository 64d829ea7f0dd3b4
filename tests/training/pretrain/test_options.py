"""A pretraining run resolves its options once: the recipe is never changed in place, the model config is built
once and passed on."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from helpers.pretrain import tiny_args, write_corpus

import convattn.config
from convattn.cli import main
from convattn.config import ConvAttnConfig
from convattn.training.recipes import apply_overrides, load_recipe

CONVATTN = str(convattn.config.__file__).rsplit("/", 1)[0]


def caller_outside_config() -> str:
    """file:line of the code that asked for a config (from_preset, in config.py, stands for its caller)."""
    frame = sys._getframe(2)
    while frame.f_code.co_filename == convattn.config.__file__:
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


@pytest.mark.slow
def test_a_pretraining_run_builds_its_config_once(tmp_path, monkeypatch):
    """transformers builds default configs of its own (to write only the fields that differ): not counted."""
    built = []
    init = ConvAttnConfig.__init__

    def counted(self, *args, **kwargs):
        caller = caller_outside_config()
        if caller.startswith(CONVATTN):
            built.append(caller)
        init(self, *args, **kwargs)

    monkeypatch.setattr(ConvAttnConfig, "__init__", counted)
    assert main(tiny_args(write_corpus(tmp_path), tmp_path / "run", "--max-steps", "4")) == 0
    assert len(built) == 1, built


def test_overrides_leave_the_recipe_they_start_from_as_it_was():
    paper = load_recipe("chang2021-small")
    recipe, note = apply_overrides(paper, {"max_steps": 300})
    assert (recipe.max_steps, recipe.warmup) == (300, 24) and "24 steps" in note
    assert (paper.max_steps, paper.warmup) == (125000, 10000)


@pytest.mark.slow
def test_the_vocabulary_built_is_said_and_recorded_when_smaller_than_asked(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(tiny_args(write_corpus(tmp_path), out, "--max-steps", "4", "--vocab-size", "5000")) == 0
    built = json.loads((out / "config.json").read_text())["vocab_size"]
    assert built < 5000 and json.loads((out / "pretrain_data.json").read_text())["vocab_size"] == built
    said = [line for line in capsys.readouterr().err.splitlines() if "fewer than the 5,000 asked" in line]
    assert len(said) == 1 and f"{built:,} pieces built" in said[0] and "--vocab-size" in said[0]


def test_vocab_size_with_a_given_tokenizer_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(tiny_args(write_corpus(tmp_path), out, "--tokenizer", str(tmp_path)))  # TINY gives --vocab-size
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "--vocab-size" in err[-1] and "--tokenizer" in err[-1] and len(err) == 1, err
    assert not out.exists()


def test_the_fields_the_memory_check_names_are_config_fields():
    """The fields `check_fits_memory` names (its lower bound on parameters, by the field that sizes them) are
    ConvAttnConfig's: a field renamed there shows here."""
    import dataclasses

    from convattn.training.pretrain.options import LAYER_FIELDS, parameters_at_least

    names = {f.name for f in dataclasses.fields(ConvAttnConfig)}
    assert set(LAYER_FIELDS) <= names and set(parameters_at_least(ConvAttnConfig())) <= names


class Vocabulary:
    """What a model takes from a tokenizer (build_model): its size and special ids."""

    pad_token_id, mask_token_id = 0, 4

    def __len__(self):
        return 100


def test_the_models_starting_weights_follow_the_runs_seed():
    """Seeds of a comparison differ in their starting weights too, not only in their data order and masks."""
    from convattn.training.pretrain.options import model_config
    from convattn.training.pretrain.trainer import build_model
    from convattn.training.recipes import resolve_recipe

    def starting_weights(seed: int) -> dict:
        recipe, _ = resolve_recipe("chang2021-small/absolute", None, {"num_hidden_layers": 1, "hidden_size": 32,
                                                                      "num_attention_heads": 4,
                                                                      "intermediate_size": 64}, {"seed": seed})
        return build_model(recipe, model_config(recipe), Vocabulary()).state_dict()

    first, again, other = starting_weights(0), starting_weights(0), starting_weights(1)
    name = "convattn.encoder.layer.0.attention.self.query.weight"
    assert first[name].equal(again[name]) and not first[name].equal(other[name])


@pytest.mark.parametrize(("training", "masked"), [({}, 0.15), ({"mlm_probability": 0.3}, 0.3)])
def test_an_electra_run_masks_its_mlm_probability_for_the_generator(training, masked):
    """--mlm-probability of an ELECTRA run was read by nothing (its model masked a constant 15 %): it now reaches
    the model's config, and so its masking, and is saved with it."""
    from convattn.training.pretrain.options import model_config
    from convattn.training.pretrain.trainer import build_model
    from convattn.training.recipes import resolve_recipe

    recipe, _ = resolve_recipe("convbert/small", None, {"num_hidden_layers": 1, "hidden_size": 32,
                                                        "num_attention_heads": 4, "intermediate_size": 64},
                               {**training, "objective": "electra"})
    model = build_model(recipe, model_config(recipe), Vocabulary())
    assert model.config.mask_probability == masked
    ids = torch.randint(5, 100, (2, 21))
    ids[:, 0], ids[:, -1] = 1, 2
    special = torch.zeros_like(ids)
    special[:, [0, -1]] = 1
    out = model(ids, special_tokens_mask=special)
    assert out.masked.sum(1).tolist() == [round(19 * masked)] * 2
