"""`convattn.meta_model`: a folder's weights held against the model its config builds on the meta device, and the
field a difference points at found from the config's class (checked through `check_model_folder`, which says it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.damage import config_with, config_without
from helpers.tiny import save_tiny_mlm, tiny_config
from safetensors.torch import load_file, save_file

from convattn import ConvAttnForMaskedLM, ConvAttnForQuestionAnswering, meta_model
from convattn.checkpoint import check_model_folder
from convattn.electra import ConvAttnForPreTraining
from convattn.errors import UsageError
from convattn.model import ConvAttnPreTrainedModel

RESTORE = "; restore config.json (the one saved with these weights)"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    return save_tiny_mlm(tmp_path_factory.mktemp("meta") / "model")


@pytest.fixture
def folder(saved, tmp_path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "model"))


def rewrite_weights(folder: Path, change) -> None:
    weights = load_file(folder / "model.safetensors")
    change(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def refusal(folder: Path) -> str:
    with pytest.raises(UsageError) as caught:
        check_model_folder(folder)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_the_model_is_built_on_the_meta_device_without_its_weight_init(folder, monkeypatch):
    def init(*args, **kwargs):
        raise AssertionError("weight init ran")

    monkeypatch.setattr(ConvAttnPreTrainedModel, "_init_weights", init)
    config = check_model_folder(folder).config
    config_with(folder, intermediate_size=48)  # (and the models built to find the field)
    assert "intermediate_size 48 does not match the weights" in refusal(folder)
    with meta_model.on_meta():
        model = ConvAttnForMaskedLM(config)
    assert {p.device.type for p in model.parameters()} == {"meta"}


@pytest.mark.parametrize(("change", "words"), [
    (lambda w: w.pop("convattn.encoder.layer.0.output.dense.weight"),
     "weights missing from the file: convattn.encoder.layer.0.output.dense.weight)"),
    (lambda w: w.update({"convattn.encoder.layer.0.output.extra": torch.zeros(3)}),
     "1 weights in the file fit no part of this model (convattn.encoder.layer.0.output.extra...)"),
    (lambda w: w.update({"convattn.encoder.layer.0.output.dense.bias": torch.zeros(5)}),
     "convattn.encoder.layer.0.output.dense.bias has shape [5] in the file but the config asks for [32]"),
])
def test_a_tensor_no_field_explains_is_named(folder, change, words):
    """A tensor missing, left over or of another shape that no one field of the config accounts for (the file was
    altered, not the config): named in the words loading uses."""
    rewrite_weights(folder, change)
    message = refusal(folder)
    assert message.startswith(f"{folder}: the weights do not match the config (") and words in message, message
    assert message.endswith("is config.json the one saved with these weights?")


def test_a_layer_renamed_in_the_file_is_named_not_counted(folder):
    """The file holds as many layers as the config asks for, one numbered 5 instead of 1: the tensors missing and
    left over are named (it said "num_hidden_layers 2 does not match the weights, which hold 2 layers")."""
    rewrite_weights(folder, lambda w: w.update({name.replace(".layer.1.", ".layer.5."): w.pop(name)
                                                for name in [n for n in w if ".layer.1." in n]}))
    message = refusal(folder)
    assert message.startswith(f"{folder}: the weights do not match the config (") and "layer.5." in message, message
    assert "layer.1." in message and "num_hidden_layers" not in message


def test_the_tied_decoder_may_be_in_the_file_or_not(folder):
    embeddings = "convattn.embeddings.word_embeddings.weight"
    rewrite_weights(folder, lambda w: w.update({"mlm_head.decoder.weight": w[embeddings].clone()}))
    check_model_folder(folder)


def test_a_layer_count_of_a_billion_is_one_line_without_building_a_billion_layers(folder):
    config_with(folder, num_hidden_layers=10**9)
    assert refusal(folder) == (f"{folder / 'config.json'}: num_hidden_layers 1000000000 does not match the weights, "
                               f"which hold 2 layers (the config's other layers would have no weights){RESTORE}")


@pytest.mark.parametrize(("field", "value"), [("vocab_size", 10**19), ("hidden_size", 4 * 10**9)])
def test_a_size_past_what_a_meta_tensor_counts_is_named(folder, field, value):
    message = refusal_after(folder, **{field: value})
    assert message.startswith(f"{folder / 'config.json'}: {field} {value} does not match the weights: the model it "
                              "describes cannot be built (") and message.endswith(RESTORE)


def refusal_after(folder: Path, **fields) -> str:
    config_with(folder, **fields)
    return refusal(folder)


@pytest.mark.parametrize(("head", "overrides", "damage", "starts"), [
    (ConvAttnForPreTraining, {"mask_token_id": 4}, {"generator_size": 0.5},
     "generator_size 0.5 does not match the weights: generator."),  # the generator's sizes, which only it has
    (ConvAttnForQuestionAnswering, {"qa_head": "joint"}, {"qa_head": "span"},
     'qa_head "span" does not describe the weights (the file holds'),
    (ConvAttnForMaskedLM, {}, {"tie_word_embeddings": False},
     "tie_word_embeddings false does not describe the weights (the file holds no mlm_head.decoder.weight)"),
])
def test_fields_of_heads_and_of_the_generator_are_named_too(tmp_path, head, overrides, damage, starts):
    head(tiny_config("chang2021-small/composite", **overrides)).save_pretrained(tmp_path / "model")
    message = refusal_after(tmp_path / "model", **damage)
    assert message.startswith(f"{tmp_path / 'model' / 'config.json'}: {starts}") and message.endswith(RESTORE), message


def test_a_field_added_to_the_config_needs_no_edit_elsewhere(tmp_path, monkeypatch):
    """A field that changes no weight, added to ConvAttnConfig (here: to a subclass put in its place): a folder saved
    with it passes, one saved before it (without it) passes, a value of another type is refused naming it, and a
    contradicted size is still named, all without a change to the checks."""
    import transformers

    import convattn
    from convattn.config import ConvAttnConfig

    class WithNewField(ConvAttnConfig):
        new_flag: bool = False

    convattn.register_auto_classes()
    monkeypatch.setattr(convattn, "register_auto_classes", lambda: None)  # (it would put ConvAttnConfig back)
    transformers.AutoConfig.register("convattn", WithNewField, exist_ok=True)
    try:
        config = WithNewField(**tiny_config("chang2021-small/composite").to_dict(), new_flag=True)
        ConvAttnForMaskedLM(config).save_pretrained(tmp_path / "model")
        assert json.loads((tmp_path / "model" / "config.json").read_text())["new_flag"] is True
        assert check_model_folder(tmp_path / "model").config.new_flag is True
        config_without(tmp_path / "model", "new_flag")
        assert check_model_folder(tmp_path / "model").config.new_flag is False
        assert "new_flag must be true or false" in refusal_after(tmp_path / "model", new_flag="yes")
        assert "intermediate_size 48 does not match the weights" in refusal_after(tmp_path / "model", new_flag=True,
                                                                                   intermediate_size=48)
    finally:
        transformers.AutoConfig.register("convattn", ConvAttnConfig, exist_ok=True)


def test_folders_that_from_pretrained_loads_pass(tmp_path):
    """What from_pretrained loads, the check lets through: a bare encoder's folder (no head prefix in its names),
    ELECTRA's (generator and discriminator sharing their embeddings), a transformers BERT whose file still holds the
    position_ids buffer it no longer saves, and a convattn config whose architectures name another library's class
    (the base model is built then, as AutoModel would)."""
    from safetensors.torch import save_file as save
    from transformers import BertConfig, BertForMaskedLM

    from convattn import ConvAttnModel

    ConvAttnModel(tiny_config("chang2021-small/composite")).save_pretrained(tmp_path / "bare")
    ConvAttnForPreTraining(tiny_config("chang2021-small/composite", mask_token_id=4)).save_pretrained(
        tmp_path / "electra")
    BertForMaskedLM(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                               vocab_size=50)).save_pretrained(tmp_path / "bert")
    weights = load_file(tmp_path / "bert" / "model.safetensors")
    save({**weights, "bert.embeddings.position_ids": torch.arange(512)[None]}, tmp_path / "bert" / "model.safetensors",
         metadata={"format": "pt"})
    for name in ("bare", "electra", "bert"):
        check_model_folder(tmp_path / name)
    config_with(tmp_path / "bare", architectures=["BertForMaskedLM"])
    check_model_folder(tmp_path / "bare")
