"""The encoder as a HuggingFace model: padding, lengths, gradients, heads, save/load."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny import assert_same_step, checkpoint_activations, randomize_, step_of, tiny_config
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

from convattn import (
    ConvAttnConfig,
    ConvAttnForMaskedLM,
    ConvAttnForQuestionAnswering,
    ConvAttnForSequenceClassification,
    ConvAttnForTokenClassification,
    ConvAttnModel,
)
from convattn.losses import masked_lm_loss
from convattn.presets import preset_names

PRESETS = [p for p in preset_names() if not p.startswith("chang2021-base/")]  # base rows = small rows at 768


def tiny_model(preset: str, cls=ConvAttnModel, **overrides):
    torch.manual_seed(0)
    model = cls(tiny_config(preset, **overrides))
    randomize_(model)
    return model.eval()


@pytest.mark.parametrize("preset", PRESETS)
def test_outputs_at_real_positions_do_not_depend_on_padding(preset):
    model = tiny_model(preset)
    generator = torch.Generator().manual_seed(1)
    lengths = [19, 8, 1]
    n = max(lengths)
    ids = torch.randint(5, 101, (3, n), generator=generator)
    keep = (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]).long()
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=keep).last_hidden_state
        # other pad ids, and ten more pad positions
        longer = torch.cat([torch.where(keep.bool(), ids, torch.randint(0, 101, ids.shape, generator=generator)),
                            torch.randint(0, 101, (3, 10), generator=generator)], dim=1)
        longer_keep = torch.cat([keep, torch.zeros(3, 10, dtype=torch.long)], dim=1)
        padded_more = model(input_ids=longer, attention_mask=longer_keep).last_hidden_state
        for b, length in enumerate(lengths):
            alone = model(input_ids=ids[b : b + 1, :length]).last_hidden_state[0]
            torch.testing.assert_close(batched[b, :length], alone, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(padded_more[b, :length], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", ["chang2021-small/absolute", "malard/transformer-n128"])
def test_absolute_positions_accept_every_length_up_to_max_and_reject_longer(preset):
    model = tiny_model(preset, max_position_embeddings=24)
    assert model.config.position_embedding_type == "absolute"
    with torch.no_grad():
        for n in range(1, 25):
            out = model(input_ids=torch.randint(5, 101, (2, n))).last_hidden_state
            assert out.shape == (2, n, 32) and torch.isfinite(out).all()
        with pytest.raises(ValueError, match="sequence length 25 exceeds max_position_embeddings=24"):
            model(input_ids=torch.randint(5, 101, (1, 25)))


@pytest.mark.parametrize("preset", ["chang2021-small/composite+key", "chang2021-small/composite+depthwise",
                                    "chang2021-small/none", "chang2021-small/conv-qkv"])
def test_models_without_absolute_positions_run_past_their_trained_length(preset):
    """Built for 128, run at 1024: nothing depends on absolute position, and padding still works there."""
    model = tiny_model(preset, max_position_embeddings=128)
    assert model.config.position_embedding_type == "none"
    ids = torch.randint(5, 101, (2, 1024))
    keep = torch.ones_like(ids)
    keep[1, 700:] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=keep).last_hidden_state
        alone = model(input_ids=ids[1:, :700]).last_hidden_state
    assert out.shape == (2, 1024, 32) and torch.isfinite(out).all()
    torch.testing.assert_close(out[1, :700], alone[0], rtol=1e-4, atol=1e-4)


def test_linformer_rejects_lengths_past_its_projection_with_a_clear_error():
    # even without absolute positions, E and F are (k, max_position_embeddings) matrices
    model = tiny_model("malard/linformer-n128-k32", position_embedding_type="none")
    with pytest.raises(ValueError, match="exceeds max_position_embeddings=64, the length the Linformer"):
        model(input_ids=torch.randint(5, 101, (1, 65)))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_trainable_parameter_gets_a_gradient(preset):
    torch.manual_seed(0)
    model = ConvAttnForMaskedLM(tiny_config(preset)).train()
    ids = torch.randint(5, 101, (3, 21))
    keep = torch.ones_like(ids)
    keep[1, 15:] = 0
    labels = torch.where(torch.rand(ids.shape) < 0.3, ids, torch.full_like(ids, -100))
    labels[:, 0] = ids[:, 0]
    model(input_ids=ids, attention_mask=keep, token_type_ids=(torch.arange(21) > 10).long().expand(3, -1),
          labels=labels).loss.backward()
    missing = [name for name, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not missing


def test_masked_lm_ties_decoder_to_word_embeddings_and_round_trips(tmp_path):
    model = tiny_model("chang2021-small/composite+conv-qkv", cls=ConvAttnForMaskedLM)
    assert model.mlm_head.decoder.weight is model.convattn.embeddings.word_embeddings.weight
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert AutoConfig.from_pretrained(tmp_path).model_type == "convattn"
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, ConvAttnForMaskedLM)
    assert loaded.mlm_head.decoder.weight is loaded.convattn.embeddings.word_embeddings.weight
    ids = torch.randint(5, 101, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    encoder = AutoModel.from_pretrained(tmp_path)
    assert isinstance(encoder, ConvAttnModel)


def test_masked_lm_loss_scores_only_labelled_positions():
    # dropout off where it takes effect, at construction, so that train and eval mode compute the same
    model = tiny_model("chang2021-small/composite", cls=ConvAttnForMaskedLM, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    ids = torch.randint(5, 101, (2, 12))
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 7] = 17, 42
    with torch.no_grad():
        eval_out = model(input_ids=ids, labels=labels)
        logits = eval_out.logits
        expected = torch.nn.functional.cross_entropy(torch.stack([logits[0, 3], logits[1, 7]]), torch.tensor([17, 42]))
        torch.testing.assert_close(eval_out.loss, expected)
        model.train()
        trained = model(input_ids=ids, labels=labels)
        torch.testing.assert_close(trained.loss, expected)
        torch.testing.assert_close(trained.logits, logits)  # the HF contract: logits come with the loss


HEADS = [ConvAttnModel, ConvAttnForMaskedLM, ConvAttnForSequenceClassification, ConvAttnForTokenClassification,
         ConvAttnForQuestionAnswering]


@pytest.mark.parametrize("cls", HEADS)
def test_return_dict_false_returns_the_same_outputs_as_a_tuple(cls):
    model = tiny_model("chang2021-small/composite", cls=cls)
    ids = torch.randint(5, 101, (2, 9))
    with torch.no_grad():
        as_dict = model(input_ids=ids, output_hidden_states=True)
        as_tuple = model(input_ids=ids, output_hidden_states=True, return_dict=False)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(as_dict.to_tuple())
    for got, expected in zip(as_tuple, as_dict.to_tuple(), strict=True):
        torch.testing.assert_close(got, expected)


def test_masked_lm_loss_reductions_agree_with_cross_entropy():
    model = tiny_model("chang2021-small/composite", cls=ConvAttnForMaskedLM)
    ids = torch.randint(5, 101, (3, 9))
    labels = torch.full_like(ids, -100)
    labels[0, 1], labels[0, 4], labels[2, 8] = 7, 9, 11  # row 1 has no scored token
    with torch.no_grad():
        hidden = model.convattn(input_ids=ids).last_hidden_state
        logits = model.mlm_head(hidden).double()
        token = {(0, 1): 7, (0, 4): 9, (2, 8): 11}
        losses = {pos: torch.nn.functional.cross_entropy(logits[pos], torch.tensor(t)) for pos, t in token.items()}
        per_example = masked_lm_loss(model.mlm_head, hidden, labels, reduction="per_example")
        expected = torch.stack([losses[0, 1] + losses[0, 4], torch.tensor(0.0, dtype=torch.float64), losses[2, 8]])
        torch.testing.assert_close(per_example, expected, rtol=1e-5, atol=1e-5)
        total = sum(losses.values())
        torch.testing.assert_close(masked_lm_loss(model.mlm_head, hidden, labels, reduction="sum").double(), total,
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(masked_lm_loss(model.mlm_head, hidden, labels).double(), total / 3,
                                   rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="reduction"):
        masked_lm_loss(model.mlm_head, hidden, labels, reduction="avg")


def test_sequence_classification_head_from_an_mlm_checkpoint(tmp_path):
    tiny_model("chang2021-small/composite", cls=ConvAttnForMaskedLM).save_pretrained(tmp_path)
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    assert isinstance(classifier, ConvAttnForSequenceClassification)
    ids = torch.randint(5, 101, (4, 10))
    out = classifier(input_ids=ids, labels=torch.tensor([0, 2, 1, 0]))
    assert out.logits.shape == (4, 3)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, torch.tensor([0, 2, 1, 0])))


def test_regression_when_one_label():
    model = ConvAttnForSequenceClassification(tiny_config("chang2021-small/fixed", num_labels=1)).eval()
    ids = torch.randint(5, 101, (3, 8))
    target = torch.tensor([0.5, 4.0, 2.5])
    out = model(input_ids=ids, labels=target)
    torch.testing.assert_close(out.loss, torch.nn.functional.mse_loss(out.logits.squeeze(-1), target))


def test_token_classification_and_question_answering_heads():
    ids = torch.randint(5, 101, (2, 11))
    tagger = ConvAttnForTokenClassification(tiny_config("chang2021-small/composite", num_labels=5)).eval()
    out = tagger(input_ids=ids, labels=torch.randint(0, 5, (2, 11)))
    assert out.logits.shape == (2, 11, 5) and out.loss.ndim == 0
    reader = ConvAttnForQuestionAnswering(tiny_config("chang2021-small/composite")).eval()
    out = reader(input_ids=ids, start_positions=torch.tensor([1, 3]), end_positions=torch.tensor([2, 40]))
    assert out.start_logits.shape == (2, 11) and torch.isfinite(out.loss)


def test_embedding_projection_only_when_sizes_differ():
    assert hasattr(ConvAttnModel(tiny_config("chang2021-small/none")), "embeddings_project")
    assert not hasattr(ConvAttnModel(tiny_config("chang2021-small/none", embedding_size=32)), "embeddings_project")


def test_attentions_and_hidden_states_are_returned_on_request():
    model = tiny_model("chang2021-small/composite")
    ids = torch.randint(5, 101, (2, 7))
    out = model(input_ids=ids, attention_mask=torch.tensor([[1] * 7, [1] * 4 + [0] * 3]),
                output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, 7, 7)
    assert len(out.hidden_states) == 3
    assert out.attentions[1][1, :, :, 4:].abs().max() == 0


def test_depthwise_convolutions_keep_pytorch_default_init():
    model = ConvAttnModel(ConvAttnConfig.from_preset("chang2021-small/depthwise", num_hidden_layers=1))
    conv = model.encoder.layer[0].attention.self.value_conv
    bound = 1 / 17**0.5
    assert conv.weight.abs().max() <= bound and conv.weight.std() > 0.5 * bound / 3**0.5
    assert 0.9 * bound < conv.bias.abs().max() <= bound  # 256 draws nearly fill it (fan-in 17, not 17 x 256)
    dense = model.encoder.layer[0].attention.self.query
    assert abs(dense.weight.std().item() - 0.02) < 0.002 and not dense.bias.any()


@pytest.mark.parametrize("preset", ["chang2021-small/absolute", "convbert/medium-small", "chang2021-small/convbert",
                                    "malard/conv-linformer-n128-k32"])
def test_fresh_weights_follow_berts_init(preset):
    """BERT's init (SPEC 1), parameter by parameter: linear and embedding weights N(0, 0.02), the padding token's
    embedding row zero, every bias zero (the MLM head's own included), LayerNorm at one and zero; the same for
    ConvBERT's separable convolution, grouped feed-forward and conv heads (transformers' ConvBERT init; the
    depthwise bias of Chang et al.'s variant too) and for Linformer's E and strided convolutions (SPEC 4)."""
    torch.manual_seed(0)
    model = ConvAttnForMaskedLM(ConvAttnConfig.from_preset(preset, num_hidden_layers=2))
    pad = model.config.pad_token_id
    for name, weight in model.named_parameters():
        if "LayerNorm" in name:
            assert torch.equal(weight, torch.ones_like(weight) if name.endswith("weight") else torch.zeros_like(weight))
        elif name.endswith("bias"):
            assert not weight.any(), name
        else:
            if name.endswith("word_embeddings.weight"):
                assert not weight[pad].any()
                weight = torch.cat([weight[:pad], weight[pad + 1:]])
            # six standard errors of the estimates (the token type table has 256 entries, a dense layer 65,536)
            error = 0.02 / weight.numel() ** 0.5
            assert abs(weight.std().item() - 0.02) < 6 * error / 2**0.5 and abs(weight.mean().item()) < 6 * error, name


def test_relative_tables_start_as_in_the_papers_code():
    """SPEC 2: beta starts at zero; W and U at nn.Linear's default there, uniform in +-1/sqrt(2r + 1) (the std of a
    uniform is its bound / sqrt(3); 1,088 entries each estimate it within about 1.4 %)."""
    config = ConvAttnConfig.from_preset("chang2021-small/composite+key", num_hidden_layers=1)
    relative = ConvAttnModel(config).encoder.layer[0].attention.self.relative
    bound = 1 / (2 * config.relative_reach + 1) ** 0.5
    assert relative.fixed.shape == (4, 17) and not relative.fixed.any()
    for kernel in (relative.query_kernel, relative.key_kernel):
        assert kernel.shape == (64, 17)
        assert bound * 0.9 < kernel.abs().max() <= bound
        assert abs(kernel.std().item() / (bound / 3**0.5) - 1) < 0.1


@pytest.mark.parametrize("preset", ["chang2021-small/composite+conv-qkv", "chang2021-small/composite+depthwise",
                                    "convbert/small", "malard/conv-linformer-n512-k128"])
def test_every_module_with_its_own_init_scheme_is_initialised(preset, monkeypatch):
    """`init_weights(std)` hooks must run at construction, including on modules whose only
    parameters are inherited (a Conv1d subclass) -- transformers skips modules it thinks are empty."""
    config = tiny_config(preset)
    owners = {type(m) for m in ConvAttnForMaskedLM(config).modules()
              if hasattr(m, "init_weights") and not isinstance(m, ConvAttnForMaskedLM | ConvAttnModel)}
    assert owners
    called = []
    for cls in owners:
        original = cls.init_weights

        def spy(self, *args, _original=original, **kwargs):
            called.append(self)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "init_weights", spy)
    model = ConvAttnForMaskedLM(config)
    expected = [m for m in model.modules() if type(m) in owners]
    assert {id(m) for m in expected} <= {id(m) for m in called}


@pytest.mark.parametrize("preset", ["chang2021-small/composite", "convbert/small", "malard/conv-linformer-n128-k32"])
def test_gradient_checkpointing_gives_the_plain_training_step(preset):
    """supports_gradient_checkpointing: recomputing activations in backward changes no loss and no gradient."""
    ids = torch.randint(5, 101, (2, 16))
    labels = ids.masked_fill(torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) > 0.3, -100)
    steps = []
    for checkpointing in (False, True):
        model = tiny_model(preset, cls=ConvAttnForMaskedLM).train()
        if checkpointing:
            checkpoint_activations(model)
        calls: list[int] = []
        model.convattn.encoder.layer[0].attention.register_forward_hook(lambda *args, calls=calls: calls.append(1))
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        loss.backward()
        assert len(calls) == (2 if checkpointing else 1)  # checkpointing runs the layer again in backward
        steps.append(step_of(model, loss))
    assert_same_step(steps)


def test_masked_lm_loss_alone_skips_the_full_decoder():
    model = tiny_model("chang2021-small/composite", cls=ConvAttnForMaskedLM)
    ids = torch.randint(5, 101, (2, 12))
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 7] = 17, 42
    torch.manual_seed(0)
    full = model(input_ids=ids, labels=labels)
    torch.manual_seed(0)
    alone = model(input_ids=ids, labels=labels, return_logits=False)
    assert alone.logits is None and full.logits.shape == (2, 12, 101)
    torch.testing.assert_close(alone.loss, full.loss)


def test_loading_a_folder_without_its_other_heads_reports_nothing_unexpected(tmp_path):
    """A pretraining folder (MLM head, or ELECTRA's generator) loaded as the encoder or a classifier: the heads
    left out are intended, not a load-report table on every load (issue 66); the new head is still reported."""
    import logging

    from convattn.electra import ConvAttnForPreTraining

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        ConvAttnForMaskedLM(tiny_config("chang2021-small/composite")).save_pretrained(tmp_path / "mlm")
        config = tiny_config("convbert/small")
        config.mask_token_id = 4
        ConvAttnForPreTraining(config).save_pretrained(tmp_path / "electra")
        for folder in (tmp_path / "mlm", tmp_path / "electra"):
            records.clear()
            ConvAttnModel.from_pretrained(folder)
            assert not any("UNEXPECTED" in r for r in records), records
            AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)
            report = "\n".join(records)
            assert "UNEXPECTED" not in report and "classifier" in report and "MISSING" in report, report
    finally:
        logger.removeHandler(handler)
