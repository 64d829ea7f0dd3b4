"""`convattn.checkpoint`: a model folder is checked before use, and loaded with every encoder weight accounted for."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.damage import config_with, pickle_only
from helpers.tiny import save_tiny_mlm, tiny_config
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForMaskedLM,
)

from convattn import ConvAttnForMaskedLM, ConvAttnForQuestionAnswering, ConvAttnModel
from convattn.checkpoint import check_model_folder, load_checked
from convattn.electra import ConvAttnForPreTraining
from convattn.errors import UsageError


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A tiny convattn MLM folder; each test works on its own copy."""
    return save_tiny_mlm(tmp_path_factory.mktemp("checkpoint") / "model")


@pytest.fixture
def folder(saved, tmp_path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "model"))


def test_a_saved_convattn_model_passes(folder):
    checked = check_model_folder(folder)
    assert checked.is_convattn and checked.local and checked.config.num_hidden_layers == 2
    model = load_checked(AutoModelForSequenceClassification, checked, num_labels=3)  # only the head is new
    assert model.config.num_labels == 3


def replace_config_text(folder: Path, text: str) -> None:
    (folder / "config.json").write_text(text)


def poison_weight(folder: Path) -> None:
    weights = load_file(folder / "model.safetensors")
    name = sorted(weights)[0]
    weights[name][0] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def truncate_weights(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


BAD_FOLDERS = [
    (lambda f: replace_config_text(f, "{not json"), "is not JSON"),
    (lambda f: replace_config_text(f, "[1, 2]"), "not a model config"),
    (lambda f: (f / "config.json").write_bytes(b"\xff\xfe\x00"), "is not a text file"),
    (lambda f: config_with(f, hidden_dropout_prob=float("nan")), "hidden_dropout_prob must be a finite number"),
    (lambda f: config_with(f, layer_norm_eps=float("inf")), "layer_norm_eps must be a finite number"),
    (lambda f: config_with(f, my_field=1, other=2), "fields convattn does not know: my_field, other"),
    (lambda f: config_with(f, model_type="no-such-type"), "model_type 'no-such-type' is neither"),
    (lambda f: config_with(f, model_type=None), "has no \"model_type\""),
    (lambda f: config_with(f, hidden_size=30), "hidden_size=30 must be divisible"),
    (lambda f: (f / "config.json").unlink(), "has no config.json"),
    (pickle_only, "holds only pickled weights (pytorch_model.bin)"),
    (lambda f: (f / "model.safetensors").unlink(), "has no model weights"),
    (truncate_weights, "truncated or corrupt"),
    (lambda f: (f / "model.safetensors").write_bytes(b""), "truncated or corrupt"),
    (lambda f: (f / "model.safetensors").write_bytes(b"\x00garbage" * 50), "truncated or corrupt"),
    (poison_weight, "holds non-finite (NaN or infinite) weights"),
    (lambda f: (f / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00002-of-00002.safetensors"}})), "lacks the weight shards"),
]


@pytest.mark.parametrize(("damage", "message"), BAD_FOLDERS)
def test_bad_folders_are_one_usage_error(folder, damage, message):
    damage(folder)
    with pytest.raises(UsageError) as caught:
        check_model_folder(folder)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_pickle_line_says_how_to_convert(folder):
    pickle_only(folder)
    with pytest.raises(UsageError, match="safetensors only") as caught:
        check_model_folder(folder)
    assert "weights_only=True" in str(caught.value) and "save_file" in str(caught.value)


def test_a_file_or_a_missing_local_path_is_refused(folder, tmp_path):
    with pytest.raises(UsageError, match="is a file"):
        check_model_folder(folder / "config.json")
    with pytest.raises(UsageError, match="no such folder"):
        check_model_folder(tmp_path / "does" / "not" / "exist")


@pytest.fixture
def bert_folder(tmp_path) -> Path:
    config = BertConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    BertForMaskedLM(config).save_pretrained(tmp_path / "bert")
    return tmp_path / "bert"


def test_a_transformers_model_is_named_and_refused_where_convattn_is_needed(bert_folder):
    checked = check_model_folder(bert_folder)
    assert not checked.is_convattn and "transformers bert model, not a convattn model" in checked.foreign_note("x")
    with pytest.raises(UsageError, match="is a transformers bert model, not a convattn model; plots need it"):
        check_model_folder(bert_folder, need_convattn="plots need it")


def test_an_older_checkpoints_position_ids_are_not_an_integer_weight(bert_folder):
    # BERT checkpoints saved by older transformers hold embeddings.position_ids (int64) beside their weights
    weights = load_file(bert_folder / "model.safetensors")
    weights["bert.embeddings.position_ids"] = torch.arange(64)[None]
    save_file(weights, bert_folder / "model.safetensors", metadata={"format": "pt"})
    check_model_folder(bert_folder)
    weights["bert.embeddings.word_embeddings.weight"] = weights["bert.embeddings.word_embeddings.weight"].bool()
    save_file(weights, bert_folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UsageError, match=r"the weight bert\.embeddings\.word_embeddings\.weight is bool, not a "
                                         r"floating-point type"):
        check_model_folder(bert_folder)


def test_a_bert_config_over_convattn_weights_is_refused_with_the_line_loading_gave(folder, bert_folder):
    """A valid BERT config over valid convattn weights: the model it builds has none of the file's tensors, which
    the folder's check says in the words loading says it (it was loading that told, before the check built the
    config's model; loading lets a task head be new, the check counts the folder's own head too)."""
    shutil.copy(bert_folder / "config.json", folder / "config.json")
    with pytest.raises(UsageError) as checked:
        check_model_folder(folder)
    with pytest.raises(UsageError) as loaded:
        load_checked(AutoModelForMaskedLM, str(folder))
    for caught in (checked, loaded):
        assert str(caught.value).startswith(f"{folder}: the weights do not match the config (")
        assert "weights are missing from the file (bert.embeddings.LayerNorm.bias, " in str(caught.value)
        assert str(caught.value).endswith("); is config.json the one saved with these weights?")
    assert "47 weights in the file fit no part of this model (convattn.embeddings.LayerNorm.bias...)" in \
        str(checked.value)


def test_a_weight_of_another_shape_is_one_line(folder):
    config_with(folder, intermediate_size=48)
    with pytest.raises(UsageError) as caught:
        load_checked(AutoModelForSequenceClassification, str(folder), num_labels=2)
    message = str(caught.value)
    assert "has shape [64] in the file but the config asks for [48]" in message
    assert "ignore_mismatched_sizes" not in message


def test_extra_encoder_layers_in_the_file_are_refused(folder):
    config_with(folder, num_hidden_layers=1)
    with pytest.raises(UsageError, match="fit no part of this model"):
        load_checked(AutoModel, str(folder))


def test_a_missing_encoder_weight_is_refused_whatever_head_is_loaded(folder):
    """Only a task head may be new: an encoder weight the file lacks would start random without a word, in a bare
    encoder (which has no head) as under any head."""
    weights = load_file(folder / "model.safetensors")
    del weights["convattn.encoder.layer.1.output.dense.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    for auto_class in (AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification):
        with pytest.raises(UsageError, match=r"encoder\.layer\.1\.output\.dense\.weight"):
            load_checked(auto_class, str(folder))


def test_non_finite_weights_are_refused_on_loading(folder):
    weights = load_file(folder / "model.safetensors")
    weights["convattn.encoder.layer.0.output.dense.bias"][0] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UsageError, match=r"non-finite \(NaN or infinite\) weights: convattn.encoder.layer.0"):
        load_checked(AutoModelForMaskedLM, str(folder))


def test_a_missing_head_is_refused_when_the_saved_head_is_wanted(folder):
    with pytest.raises(UsageError, match="missing from the file"):
        load_checked(AutoModelForSequenceClassification, str(folder), allow_new_head=False, num_labels=2)


@pytest.mark.parametrize(("preset", "head"), [
    ("chang2021-small/composite+key", ConvAttnForMaskedLM), ("chang2021-small/composite+depthwise", ConvAttnModel),
    ("chang2021-small/composite+conv-qkv", ConvAttnForQuestionAnswering), ("chang2021-small/absolute", ConvAttnModel),
    ("convbert/medium-small", ConvAttnForPreTraining), ("malard/linformer-n128-k32", ConvAttnForMaskedLM),
    ("malard/conv-linformer-n128-k32", ConvAttnModel),
])
def test_every_mechanism_saved_with_any_head_passes_the_size_checks(tmp_path, preset, head):
    """The sizes and tables read from the weights' headers agree with the config for every mechanism's weights (a
    pretraining checkpoint's generator has sizes of its own)."""
    config = tiny_config(preset, relative_reach=5, conv_projection_kernel=13, conv_kernel_size=7, mask_token_id=4)
    head(config).save_pretrained(tmp_path / "model")
    assert check_model_folder(tmp_path / "model").config.relative_reach == 5


@pytest.mark.parametrize(("damage", "message"), [
    (lambda f: config_with(f, conv_projection_kernel=15), "conv_projection_kernel 15 does not match the weights"),
    (lambda f: config_with(f, num_attention_heads=2), "num_attention_heads 2 does not match the weights"),
    (lambda f: config_with(f, value_depthwise_conv=False), "value_depthwise_conv false does not describe the weights"),
])
def test_sizes_and_tables_of_other_mechanisms_are_held_against_the_weights(tmp_path, damage, message):
    config = tiny_config("chang2021-small/composite+depthwise", conv_projections=["query"], relative_reach=5)
    ConvAttnModel(config).save_pretrained(tmp_path / "model")
    damage(tmp_path / "model")
    with pytest.raises(UsageError, match=message):
        check_model_folder(tmp_path / "model")


@pytest.mark.parametrize(("damage", "message"), [
    (lambda f: config_with(f, hidden_size=10**9), "hidden_size 1000000000 does not match the weights"),
    (lambda f: config_with(f, num_hidden_layers=7), "num_hidden_layers 7 does not match the weights"),
    (lambda f: config_with(f, pad_token_id=101), "pad_token_id 101 is outside the vocabulary of 101"),
    (lambda f: config_with(f, dtype="float77"), 'dtype "float77" is not a torch dtype'),
])
def test_a_transformers_bert_folder_is_held_against_its_weights_too(bert_folder, damage, message):
    damage(bert_folder)
    with pytest.raises(UsageError, match=message):
        check_model_folder(bert_folder)


@pytest.mark.parametrize(("errno_name", "error"), [("ENOSPC", OSError), ("EROFS", OSError), (None, UsageError)])
def test_a_failed_write_while_loading_is_the_disks_not_the_models(tmp_path, monkeypatch, errno_name, error):
    """A full disk under log.txt while transformers loads (its load report is logged) is said as a full disk by the
    command line, not as a model that could not be loaded; transformers' own OSError for a bad folder is the
    model's."""
    import errno
    import os

    from convattn.cli import known_cause

    code = getattr(errno, errno_name) if errno_name else None
    failure = OSError(code, os.strerror(code)) if code else OSError("not a model folder")
    monkeypatch.setattr(AutoModel, "from_pretrained", lambda *args, **kwargs: (_ for _ in ()).throw(failure))
    with pytest.raises(error) as raised:
        load_checked(AutoModel, tmp_path)
    if code == errno.ENOSPC:
        assert "free some space" in known_cause(raised.value)


# (preset, its overrides, the head saved, the damage to config.json, the field and value the line names, its verb):
# every config field whose value the weights' shapes or tables show, named with the value the config holds
FIELDS_THE_WEIGHTS_SHOW = [
    ("chang2021-small/composite", {}, ConvAttnForMaskedLM, {"intermediate_size": 48}, "intermediate_size 48",
     "match"),
    ("chang2021-small/composite", {}, ConvAttnForMaskedLM, {"embedding_size": 8}, "embedding_size 8", "match"),
    ("chang2021-small/composite", {}, ConvAttnForMaskedLM, {"type_vocab_size": 3}, "type_vocab_size 3", "match"),
    ("chang2021-small/absolute", {}, ConvAttnModel, {"position_embedding_type": "none"},
     'position_embedding_type "none"', "describe"),
    ("convbert/medium-small", {}, ConvAttnModel, {"head_ratio": 1}, "head_ratio 1", "describe"),
    ("chang2021-small/convbert", {"conv_kernel_size": 7}, ConvAttnModel, {"conv_kernel_size": 5},
     "conv_kernel_size 5", "match"),
    ("chang2021-small/composite+depthwise", {"relative_reach": 5}, ConvAttnModel, {"relative_reach": 4},
     "relative_reach 4", "match"),
    ("chang2021-small/composite+conv-qkv", {}, ConvAttnModel, {"conv_projections": ["query", "key"]},
     'conv_projections ["query", "key"]', "describe"),
    ("malard/linformer-n128-k32", {}, ConvAttnModel, {"linformer_k": 8}, "linformer_k 8", "match"),
    ("malard/conv-linformer-n128-k32", {}, ConvAttnModel, {"linformer_k": 8}, "linformer_k 8", "match"),
    ("malard/linformer-n128-k32", {}, ConvAttnModel, {"max_position_embeddings": 128}, "max_position_embeddings 128",
     "match"),
]


@pytest.mark.parametrize(("preset", "overrides", "head", "damage", "named", "verb"), FIELDS_THE_WEIGHTS_SHOW)
def test_a_field_the_weights_contradict_is_named_with_its_value_and_the_fix(tmp_path, preset, overrides, head,
                                                                            damage, named, verb):
    head(tiny_config(preset, **overrides)).save_pretrained(tmp_path / "model")
    config_with(tmp_path / "model", **damage)
    with pytest.raises(UsageError) as caught:
        check_model_folder(tmp_path / "model")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'model' / 'config.json'}: {named} does not {verb} the weights"), message
    assert message.endswith("; restore config.json (the one saved with these weights)") and "\n" not in message
    if verb == "match":
        assert " in the file but the config asks for " in message, message


def test_fewer_layers_than_the_weights_is_named_with_both_counts(folder):
    config_with(folder, num_hidden_layers=1)
    with pytest.raises(UsageError, match=r"num_hidden_layers 1 does not match the weights, which hold 2 layers \(the "
                                         r"weights of the others fit no part of this model\); restore config\.json"):
        check_model_folder(folder)


@pytest.mark.parametrize(("head", "overrides"), [
    (ConvAttnForQuestionAnswering, {"qa_head": "joint"}),  # ELECTRA's joint SQuAD head, tensors of its own
    (ConvAttnForMaskedLM, {"tie_word_embeddings": False}),  # the decoder saved beside the embeddings
    (ConvAttnForPreTraining, {"mask_token_id": 4, "generator_size": 0.5}),  # the generator shares the embeddings
])
def test_heads_with_tensors_of_their_own_or_shared_pass(tmp_path, head, overrides):
    head(tiny_config("chang2021-small/composite", **overrides)).save_pretrained(tmp_path / "model")
    assert check_model_folder(tmp_path / "model").is_convattn


def test_transformers_models_with_any_head_pass(tmp_path):
    from transformers import BertForSequenceClassification, BertModel

    config = BertConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, num_labels=3)
    for model in (BertModel(config), BertForSequenceClassification(config)):
        model.save_pretrained(tmp_path / type(model).__name__)
        assert not check_model_folder(tmp_path / type(model).__name__).is_convattn
