"""`transformers` ConvBERT <-> convattn: identical outputs, lossless round trips, saved directories."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from transformers import BertConfig, BertModel, ConvBertConfig

from convattn import (
    ConvAttnConfig,
    ConvAttnForMaskedLM,
    ConvAttnForQuestionAnswering,
    ConvAttnForSequenceClassification,
    ConvAttnForTokenClassification,
    ConvAttnModel,
)
from convattn.interop.convbert import from_transformers, to_transformers

# SPEC section 3 widths; 2 layers and a small vocabulary keep the tests fast (per-layer shapes are unchanged)
SHAPES = {
    "small": dict(embedding_size=128, hidden_size=256, num_attention_heads=4, intermediate_size=1024, num_groups=1),
    "medium-small": dict(embedding_size=128, hidden_size=384, num_attention_heads=8, intermediate_size=1536,
                         num_groups=2),
}
OURS = {
    "ConvBertModel": ConvAttnModel,
    "ConvBertForMaskedLM": ConvAttnForMaskedLM,
    "ConvBertForSequenceClassification": ConvAttnForSequenceClassification,
    "ConvBertForTokenClassification": ConvAttnForTokenClassification,
    "ConvBertForQuestionAnswering": ConvAttnForQuestionAnswering,
}


def hf_model(cls_name: str, shape: str = "small", **fields):
    """A random-initialised transformers model; every parameter perturbed so zero/one inits hide nothing."""
    torch.manual_seed(0)
    fields = {"vocab_size": 500, "num_hidden_layers": 2, "max_position_embeddings": 128, "pad_token_id": 0,
              "num_labels": 2 if cls_name == "ConvBertForQuestionAnswering" else 3, **SHAPES[shape], **fields}
    model = getattr(transformers, cls_name)(ConvBertConfig(**fields)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def first_output(output) -> torch.Tensor:
    for name in ("last_hidden_state", "logits", "start_logits"):
        if getattr(output, name, None) is not None:
            return getattr(output, name)
    raise AssertionError(output)


def batch(n=37, size=3, seed=1):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 500, (size, n), generator=generator)
    types = (torch.arange(n) >= n // 2).long().expand(size, -1)
    return ids, types


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("cls_name", ["ConvBertModel", "ConvBertForMaskedLM", "ConvBertForSequenceClassification"])
def test_converted_models_give_identical_outputs_and_round_trip(cls_name, shape):
    hf = hf_model(cls_name, shape)
    ours = from_transformers(hf, convbert_padding="reference")
    assert type(ours) is OURS[cls_name] and ours.config.num_groups == SHAPES[shape]["num_groups"]
    ids, types = batch()
    with torch.no_grad():
        expected = first_output(hf(input_ids=ids, token_type_ids=types))
        got = first_output(ours(input_ids=ids, token_type_ids=types))
    assert (got - expected).abs().max() < 1e-5
    back = to_transformers(ours)
    assert type(back) is type(hf)
    original, returned = hf.state_dict(), back.state_dict()
    assert original.keys() == returned.keys()
    assert all(torch.equal(original[k], returned[k]) for k in original)


@pytest.mark.parametrize("cls_name", list(OURS))
def test_every_supported_head_converts_both_ways(cls_name):
    hf = hf_model(cls_name, hidden_size=64, embedding_size=32, num_attention_heads=4, intermediate_size=128)
    ours = from_transformers(hf)
    ids, types = batch(n=12)
    with torch.no_grad():
        torch.testing.assert_close(first_output(ours(input_ids=ids, token_type_ids=types)),
                                   first_output(hf(input_ids=ids, token_type_ids=types)), rtol=1e-5, atol=1e-5)
    again = from_transformers(to_transformers(ours))
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in ours.state_dict().items())


def test_masked_lm_decoder_stays_tied_to_the_word_embeddings():
    ours = from_transformers(hf_model("ConvBertForMaskedLM"))
    assert ours.mlm_head.decoder.weight is ours.convattn.embeddings.word_embeddings.weight
    back = to_transformers(ours)
    assert back.generator_lm_head.weight is back.convbert.embeddings.word_embeddings.weight


def test_config_fields_map_both_ways():
    hf = hf_model("ConvBertForSequenceClassification", conv_kernel_size=7, num_groups=2,
                  layer_norm_eps=1e-7, classifier_dropout=0.3, hidden_dropout_prob=0.05, pad_token_id=3)
    config = from_transformers(hf).config
    assert (config.conv_kernel_size, config.layer_norm_eps, config.classifier_dropout) == (7, 1e-7, 0.3)
    assert (config.hidden_dropout_prob, config.pad_token_id, config.num_labels) == (0.05, 3, 3)
    assert (config.position_embedding_type, config.head_ratio, config.convbert_padding) == ("absolute", 2, "masked")
    back = to_transformers(from_transformers(hf)).config
    for field in ("conv_kernel_size", "layer_norm_eps", "classifier_dropout", "pad_token_id", "num_groups",
                  "num_labels", "embedding_size", "max_position_embeddings", "vocab_size"):
        assert getattr(back, field) == getattr(hf.config, field), field


def test_fields_off_their_defaults_convert_and_keep_the_outputs():
    """Fields whose defaults agree in both libraries, set otherwise: three token types, an untied masked-LM decoder,
    a problem type and an initializer range, both ways."""
    fields = dict(type_vocab_size=3, tie_word_embeddings=False, initializer_range=0.05,
                  problem_type="multi_label_classification")
    hf = hf_model("ConvBertForMaskedLM", **fields)
    ours = from_transformers(hf)
    assert ours.mlm_head.decoder.weight is not ours.convattn.embeddings.word_embeddings.weight
    ids, _ = batch(n=12)
    types = torch.arange(12).remainder(3).expand(3, -1)
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids, token_type_ids=types).logits,
                                   hf(input_ids=ids, token_type_ids=types).logits, rtol=1e-5, atol=1e-5)
    for config in (ours.config, to_transformers(ours).config):
        assert {field: getattr(config, field) for field in fields} == fields


def test_a_convbert_model_with_rotary_positions_is_refused_naming_them():
    """(conv_projections, value_depthwise_conv and a sequence projection, which the conversion refuses too, no
    ConvBERT config takes: the config refuses them first.)"""
    config = ConvAttnConfig.from_preset("chang2021-small/convbert", num_hidden_layers=1,
                                        position_embedding_type="rotary")
    with pytest.raises(ValueError, match="position_embedding_type='rotary' has no equivalent in transformers'"):
        to_transformers(ConvAttnModel(config))


def test_what_a_folder_holds_is_checked_before_converting(tmp_path):
    """A folder of another model type, or of a ConvBERT head convattn has not, is named; a config without
    architectures is read as transformers reads it, the bare ConvBertModel."""
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         vocab_size=50)).save_pretrained(tmp_path / "bert")
    with pytest.raises(ValueError, match="holds a BertConfig, not a ConvBertConfig"):
        from_transformers(tmp_path / "bert")
    hf = hf_model("ConvBertModel", hidden_size=64, embedding_size=32, num_attention_heads=4, intermediate_size=128)
    for folder, architectures in (("choice", ["ConvBertForMultipleChoice"]), ("none", None)):
        hf.config.architectures = architectures
        hf.save_pretrained(tmp_path / folder)
        config = json.loads((tmp_path / folder / "config.json").read_text())
        config["architectures"] = architectures
        (tmp_path / folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="holds a ConvBertForMultipleChoice; supported: ConvBertModel"):
        from_transformers(tmp_path / "choice")
    assert type(from_transformers(tmp_path / "none")) is ConvAttnModel


def test_a_weight_with_no_place_is_refused_and_the_converted_model_evaluates():
    """Every weight lands (a tensor left over stops the conversion rather than being dropped), and both directions
    give a model in eval mode whatever mode the source was in."""
    hf = hf_model("ConvBertModel", hidden_size=64, embedding_size=32, num_attention_heads=4, intermediate_size=128)
    assert not to_transformers(from_transformers(hf).train()).training
    hf.register_buffer("stray", torch.zeros(2))
    with pytest.raises(RuntimeError, match="stray"):
        from_transformers(hf)
    with pytest.raises(ValueError, match="cannot convert a BertModel; supported: ConvAttnModel"):
        to_transformers(BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=64, vocab_size=50)))


def test_padding_modes_on_padded_batches():
    """reference: transformers' output everywhere (its leak included); masked: each sequence as if alone."""
    hf = hf_model("ConvBertModel")
    ids, types = batch(n=20)
    keep = (torch.arange(20)[None, :] < torch.tensor([[20], [13], [6]])).long()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=keep, token_type_ids=types).last_hidden_state
        reference = from_transformers(hf, convbert_padding="reference")
        got = reference(input_ids=ids, attention_mask=keep, token_type_ids=types).last_hidden_state
        assert (got - expected).abs().max() < 1e-5
        masked = from_transformers(hf)(input_ids=ids, attention_mask=keep, token_type_ids=types).last_hidden_state
        for b, length in enumerate([20, 13, 6]):
            alone = hf(input_ids=ids[b : b + 1, :length], token_type_ids=types[b : b + 1, :length]).last_hidden_state
            assert (masked[b, :length] - alone[0]).abs().max() < 1e-5
            if length < 20:  # transformers itself leaks padding into the real tokens
                assert (expected[b, :length] - alone[0]).abs().max() > 1e-3


def test_saved_directories_convert(tmp_path):
    hf = hf_model("ConvBertForMaskedLM", shape="medium-small")
    hf.save_pretrained(tmp_path / "hf")
    ours = from_transformers(tmp_path / "hf", convbert_padding="reference")
    assert isinstance(ours, ConvAttnForMaskedLM)
    ids, types = batch(n=16)
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=types).logits
        assert (ours(input_ids=ids, token_type_ids=types).logits - expected).abs().max() < 1e-5
        to_transformers(ours).save_pretrained(tmp_path / "back")
        reloaded = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "back").eval()
        assert isinstance(reloaded, transformers.ConvBertForMaskedLM)
        assert (reloaded(input_ids=ids, token_type_ids=types).logits - expected).abs().max() < 1e-5
    hf_model("ConvBertForSequenceClassification").save_pretrained(tmp_path / "cls")
    assert isinstance(from_transformers(str(tmp_path / "cls")), ConvAttnForSequenceClassification)


def test_what_cannot_convert_is_named():
    with pytest.raises(ValueError, match="cannot convert a BertModel"):
        from_transformers(BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                               intermediate_size=64, vocab_size=50)))
    composite = ConvAttnModel(ConvAttnConfig.from_preset("chang2021-small/convbert", relative_terms=["fixed"],
                                                         num_hidden_layers=1))
    with pytest.raises(ValueError, match=r"relative_terms=.*no equivalent in transformers' ConvBERT"):
        to_transformers(composite)
    with pytest.raises(ValueError, match="head_ratio=1"):
        to_transformers(ConvAttnModel(ConvAttnConfig(num_hidden_layers=1)))
    with pytest.raises(ValueError, match="head_ratio=1: only ConvBERT models with conv heads"):
        from_transformers(hf_model("ConvBertModel", head_ratio=1))


@pytest.mark.parametrize("cls_name", ["ConvBertForSequenceClassification", "ConvBertForMaskedLM"])
def test_training_mode_drops_where_transformers_drops(cls_name):
    """In training, with hidden dropout, the converted model equals transformers' on the same generator state: the
    dropouts sit where its do (embeddings, both add & norms, the classification head before and after its dense
    layer), draw the same shapes in the same order and nowhere else. Attention dropout is 0: SDPA's masks are not
    nn.Dropout's."""
    hf = hf_model(cls_name, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.0).train()
    ours = from_transformers(hf, convbert_padding="reference").train()
    ids, types = batch()
    outputs = []
    for model in (hf, ours):
        torch.manual_seed(7)
        outputs.append(first_output(model(input_ids=ids, token_type_ids=types)))
    torch.manual_seed(8)
    other_draw = first_output(ours(input_ids=ids, token_type_ids=types))
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
    assert (other_draw - outputs[0]).abs().max() > 1e-3  # the dropout is on


@pytest.mark.parametrize("cls_name", [name for name in OURS if name != "ConvBertModel"])
def test_every_heads_loss_is_transformers_loss(cls_name):
    """Each task head's loss equals transformers' on the same labels: unscored tokens (-100) left out of the
    masked-LM and token losses; the span loss the mean of the start's and the end's, a position at the window's end
    or past it ignored, a negative one taken as the first."""
    hf = hf_model(cls_name, hidden_size=64, embedding_size=32, num_attention_heads=4, intermediate_size=128)
    ours = from_transformers(hf)
    ids, types = batch(n=12)
    generator = torch.Generator().manual_seed(2)
    if cls_name == "ConvBertForQuestionAnswering":
        labels = dict(start_positions=torch.tensor([1, 12, -3]), end_positions=torch.tensor([2, 40, 7]))
    elif cls_name == "ConvBertForSequenceClassification":
        labels = dict(labels=torch.tensor([0, 2, 1]))
    else:
        tokens = torch.randint(0, hf.config.vocab_size if "Masked" in cls_name else 3, ids.shape, generator=generator)
        labels = dict(labels=tokens.masked_fill(torch.rand(ids.shape, generator=generator) < 0.5, -100))
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=types, **labels).loss
        got = ours(input_ids=ids, token_type_ids=types, **labels).loss
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
