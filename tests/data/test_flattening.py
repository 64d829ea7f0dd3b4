"""The flattening collator, and flattened batches training a convattn masked LM through the HF Trainer."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny import randomize_, tiny_wordpiece_tokenizer
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorWithFlattening,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from convattn import ConvAttnConfig, ConvAttnForMaskedLM, ConvAttnForSequenceClassification
from convattn.data.flattening import FlatteningCollator

SENTENCES = [
    "the cat sat on the mat",
    "a dog ran across the long field today",
    "rain fell",
    "she read the book twice before she slept",
    "birds sing in the early morning light near the river",
    "we walked home",
    "the old clock in the hall struck nine",
    "light travels fast",
] * 4


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_wordpiece_tokenizer(SENTENCES, vocab_size=200)


def pair_examples(tokenizer) -> list[dict]:
    """The `pairs` layout: [CLS] line [SEP] next line [SEP], with token types and the special tokens mask."""
    encoded = tokenizer(SENTENCES[:-1], SENTENCES[1:], return_special_tokens_mask=True, return_token_type_ids=True)
    return [dict(zip(encoded.keys(), values, strict=True)) for values in zip(*encoded.values(), strict=True)]


def tiny_model(tokenizer, cls=ConvAttnForMaskedLM, preset="chang2021-small/composite+depthwise", **fields):
    config = ConvAttnConfig.from_preset(
        preset,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=32,
        embedding_size=16,
        num_attention_heads=4,
        intermediate_size=64,
        num_hidden_layers=2,
        **fields,
    )
    torch.manual_seed(0)
    model = cls(config)
    randomize_(model)
    return model


def padded_batch(features: list[dict], pad_id: int) -> dict:
    n = max(len(f["input_ids"]) for f in features)
    batch = {"input_ids": torch.full((len(features), n), pad_id), "attention_mask": torch.zeros(len(features), n)}
    batch["labels"] = torch.full((len(features), n), -100)
    for row, f in enumerate(features):
        length = len(f["input_ids"])
        batch["input_ids"][row, :length] = torch.tensor(f["input_ids"])
        batch["attention_mask"][row, :length] = 1
        batch["labels"][row, :length] = torch.tensor(f["labels"])
    return batch


def test_the_layout_is_transformers_flattening_with_token_types_kept(tokenizer):
    examples = pair_examples(tokenizer)[:5]
    ours = FlatteningCollator(return_flash_attn_kwargs=True)(examples)
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": e["input_ids"]} for e in examples]
    )
    for key in ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
        assert torch.equal(torch.as_tensor(ours[key]), torch.as_tensor(theirs[key])), key
    assert ours["token_type_ids"].tolist() == [[t for e in examples for t in e["token_type_ids"]]]
    assert "special_tokens_mask" not in ours


def test_an_empty_example_is_left_out_with_its_label(tokenizer):
    """As transformers' collator leaves it out: it has no token to classify, and kept it would add a label (and an
    empty sequence) that no sequence of the row answers."""
    examples = [dict(e, label=i % 2) for i, e in enumerate(pair_examples(tokenizer)[:3])]
    empty = {"input_ids": [], "token_type_ids": [], "label": 1}
    collate = FlatteningCollator(return_flash_attn_kwargs=True)
    with_empty, without = collate([examples[0], empty, *examples[1:]]), collate(examples)
    assert with_empty.keys() == without.keys()
    for key, value in without.items():
        assert torch.equal(torch.as_tensor(with_empty[key]), torch.as_tensor(value)), key


def test_masking_follows_mlm_statistics_and_never_touches_special_tokens(tokenizer):
    examples = pair_examples(tokenizer) * 20
    masking = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    masking.generator = torch.Generator().manual_seed(0)
    batch = FlatteningCollator(masking=masking)(examples)
    original = torch.tensor([t for e in examples for t in e["input_ids"]])
    special = torch.tensor([s for e in examples for s in e["special_tokens_mask"]]).bool()
    labels, inputs = batch["labels"][0], batch["input_ids"][0]
    scored = labels != -100
    assert not scored[special].any() and torch.equal(inputs[special], original[special])
    assert torch.equal(labels[scored], original[scored])
    assert torch.equal(inputs[~scored], original[~scored])
    fraction = scored.sum() / (~special).sum()
    assert 0.12 < fraction < 0.18  # 15 % of the maskable tokens, over ~1,000 of them
    assert 0.7 < (inputs[scored] == tokenizer.mask_token_id).float().mean() < 0.9  # 80 % become [MASK]


def test_one_label_per_example_classifies_each_example(tokenizer):
    examples = [dict(e, label=i % 2) for i, e in enumerate(pair_examples(tokenizer)[:5])]
    batch = FlatteningCollator()(examples)
    assert batch["labels"].tolist() == [0, 1, 0, 1, 0]
    model = tiny_model(tokenizer, ConvAttnForSequenceClassification, num_labels=2).double().eval()
    with torch.no_grad():
        flattened = model(**batch)
        alone = torch.cat(
            [
                model(
                    input_ids=torch.tensor([e["input_ids"]]), token_type_ids=torch.tensor([e["token_type_ids"]])
                ).logits
                for e in examples
            ]
        )
    torch.testing.assert_close(flattened.logits, alone, rtol=1e-5, atol=1e-5)


def test_regression_labels_stay_the_numbers_they_are(tokenizer):
    """STS-B's scores (one float per example) reach the regression loss as they are, not cut to whole numbers;
    class numbers stay integers, as cross-entropy needs."""
    examples = pair_examples(tokenizer)[:3]
    scores = FlatteningCollator()([dict(e, label=score) for e, score in zip(examples, [3.8, 0.25, 5.0], strict=True)])
    assert scores["labels"].is_floating_point() and scores["labels"].tolist() == pytest.approx([3.8, 0.25, 5.0])
    classes = FlatteningCollator()([dict(e, label=i) for i, e in enumerate(examples)])
    assert classes["labels"].dtype == torch.long and classes["labels"].tolist() == [0, 1, 2]


def test_examples_as_tensors_flatten_as_the_same_examples_as_lists(tokenizer):
    """A dataset in torch format gives each example's columns as 1-d tensors and its label as a 0-d tensor: the
    flattened batch is the one its lists give."""
    examples = [dict(e, label=i % 2) for i, e in enumerate(pair_examples(tokenizer)[:4])]
    tensors = [{key: torch.tensor(value) for key, value in e.items()} for e in examples]
    collate = FlatteningCollator(return_flash_attn_kwargs=True)
    from_lists, from_tensors = collate(examples), collate(tensors)
    assert from_tensors.keys() == from_lists.keys()
    for key, value in from_lists.items():
        assert torch.equal(torch.as_tensor(from_tensors[key]), torch.as_tensor(value)), key


def test_masking_leaves_alone_exactly_what_the_examples_mark_special(tokenizer):
    """The examples' special_tokens_mask decides what masking leaves alone, as on a padded batch: formatted rows
    mark only [CLS] and [SEP], so an [UNK] of the text is masked like any token (the tokenizer's own guess would
    count it special and never mask it)."""
    examples = pair_examples(tokenizer)[:4]
    for e in examples:
        e["input_ids"][2] = tokenizer.unk_token_id
    masking = DataCollatorForLanguageModeling(tokenizer, mlm_probability=1.0)
    batch = FlatteningCollator(masking=masking)(examples)
    special = torch.tensor([s for e in examples for s in e["special_tokens_mask"]]).bool()
    assert torch.equal(batch["labels"][0] != -100, ~special)
    padded = masking([{"input_ids": e["input_ids"], "special_tokens_mask": e["special_tokens_mask"]}
                      for e in examples])
    assert (padded["labels"] != -100).sum() == (~special).sum()


def test_masking_refuses_examples_that_carry_labels(tokenizer):
    examples = [dict(e, label=0) for e in pair_examples(tokenizer)[:2]]
    with pytest.raises(ValueError, match="masking makes the labels"):
        FlatteningCollator(masking=DataCollatorForLanguageModeling(tokenizer))(examples)


class Losses(TrainerCallback):
    def __init__(self):
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])


def test_transformers_flattening_collator_trains_a_masked_lm_through_the_trainer(tokenizer, tmp_path):
    """DataCollatorWithFlattening's input_ids and position_ids, with MLM labels made per example beforehand: the
    Trainer's loss on a flattened batch is the padded batch's, and a few steps train the model."""
    masking = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3)
    masking.generator = torch.Generator().manual_seed(0)
    features = []
    for example in pair_examples(tokenizer):
        ids, labels = masking.torch_mask_tokens(
            torch.tensor([example["input_ids"]]), torch.tensor([example["special_tokens_mask"]])
        )
        features.append({"input_ids": ids[0].tolist(), "labels": labels[0].tolist()})
    model = tiny_model(tokenizer)
    collator = DataCollatorWithFlattening()
    first = collator(features[:4])
    assert first["input_ids"].shape[0] == 1 and "attention_mask" not in first
    with torch.no_grad():
        model.eval()
        flattened_loss = model(**first).loss
        padded_loss = model(**padded_batch(features[:4], tokenizer.pad_token_id)).loss
    torch.testing.assert_close(flattened_loss, padded_loss, rtol=1e-5, atol=1e-5)

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    losses = Losses()
    args = TrainingArguments(
        str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=6,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
    )
    Trainer(model=model, args=args, train_dataset=features, data_collator=collator, callbacks=[losses]).train()
    assert len(losses.losses) == 6 and all(torch.isfinite(torch.tensor(losses.losses)))
    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert "convattn.encoder.layer.0.attention.self.value_conv.weight" in changed


@pytest.mark.parametrize("preset", ["chang2021-small/rotary", "chang2021-small/alibi",
                                    "chang2021-small/composite+rotary"])
def test_a_flattened_batch_of_rotary_or_alibi_models_has_the_padded_batchs_loss(tokenizer, preset):
    """DataCollatorWithFlattening's position_ids restart rotary's angles and ALiBi's distances at every example,
    so its batch has the padded batch's loss."""
    masking = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3)
    masking.generator = torch.Generator().manual_seed(0)
    features = []
    for example in pair_examples(tokenizer)[:5]:
        ids, labels = masking.torch_mask_tokens(
            torch.tensor([example["input_ids"]]), torch.tensor([example["special_tokens_mask"]])
        )
        features.append({"input_ids": ids[0].tolist(), "labels": labels[0].tolist()})
    torch.manual_seed(0)
    model = tiny_model(tokenizer, preset=preset).eval()
    randomize_(model)
    with torch.no_grad():
        flattened = model(**DataCollatorWithFlattening()(features)).loss
        padded = model(**padded_batch(features, tokenizer.pad_token_id)).loss
    torch.testing.assert_close(flattened, padded, rtol=1e-5, atol=1e-5)


def test_examples_with_and_without_token_types_flatten_with_zeros_for_the_missing_ones(tokenizer):
    """A batch mixing sentence pairs (token types 0 and 1) with single sentences (no token_type_ids): those get
    0s, and each example is classified as it is alone."""
    pairs = pair_examples(tokenizer)[:3]
    singles = [{"input_ids": ids} for ids in tokenizer(SENTENCES[3:5])["input_ids"]]
    examples = [dict(e, label=i % 2) for i, e in enumerate([pairs[0], singles[0], pairs[1], singles[1], pairs[2]])]
    batch = FlatteningCollator(return_flash_attn_kwargs=True)(examples)
    token_types = [e.get("token_type_ids", [0] * len(e["input_ids"])) for e in examples]
    assert batch["token_type_ids"].tolist() == [[t for types in token_types for t in types]]
    assert batch["labels"].tolist() == [0, 1, 0, 1, 0]
    model = tiny_model(tokenizer, ConvAttnForSequenceClassification, num_labels=2).double().eval()
    with torch.no_grad():
        flattened = model(**batch).logits
        alone = torch.cat([model(input_ids=torch.tensor([e["input_ids"]]), token_type_ids=torch.tensor([types])).logits
                           for e, types in zip(examples, token_types, strict=True)])
    torch.testing.assert_close(flattened, alone, rtol=1e-5, atol=1e-5)


def test_examples_without_a_special_tokens_mask_get_the_tokenizers_for_masking(tokenizer):
    examples = pair_examples(tokenizer) * 10
    examples = [e if i % 2 else {k: v for k, v in e.items() if k != "special_tokens_mask"}
                for i, e in enumerate(examples)]
    masking = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.5)
    masking.generator = torch.Generator().manual_seed(0)
    batch = FlatteningCollator(masking=masking)(examples)
    original = torch.tensor([t for e in examples for t in e["input_ids"]])
    special = torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    assert special.sum() == 3 * len(examples)  # [CLS] and two [SEP] in every example
    scored = batch["labels"][0] != -100
    assert not scored[special].any() and scored.any()
    assert torch.equal(batch["input_ids"][0][special], original[special])


# (case, how the examples are changed, what the one-line error must match)
NOT_FLATTENED = [
    ("some examples with a label, some without", lambda es: [dict(es[0], label=1), *es[1:]],
     r"labels: 1 of 3 examples carry one \('labels' or 'label'\); every example or none"),
    ("every example but one with a label", lambda es: [es[0], *(dict(e, label=1) for e in es[1:])],
     r"labels: 2 of 3 examples carry one \('labels' or 'label'\); every example or none"),
    ("token labels beside example labels", lambda es: [dict(es[0], labels=es[0]["input_ids"]),
                                                       *(dict(e, label=0) for e in es[1:])],
     "labels: some examples carry one per token, others one per example"),
    ("token labels shorter than the example", lambda es: [dict(e, labels=e["input_ids"][:-1]) for e in es],
     "labels of example 0 has .* entries for its .* input_ids"),
    ("token types shorter than the example", lambda es: [es[0], dict(es[1], token_type_ids=[0, 1]), es[2]],
     "token_type_ids of example 1 has 2 entries for its .* input_ids"),
    ("a padded example", lambda es: [es[0], dict(es[1], attention_mask=[1] * (len(es[1]["input_ids"]) - 1) + [0]),
                                     es[2]],
     r"example 1 is padded \(its attention_mask holds 0s\)"),
    ("embeddings, not ids", lambda es: [{"inputs_embeds": torch.randn(4, 16)}],
     r"example 0 has no input_ids \(it carries inputs_embeds\): FlatteningCollator flattens token ids"),
    ("a batch of one as the tokenizer's tensors", lambda es: [{k: torch.tensor([v]) for k, v in e.items()} for e in es],
     r"input_ids of example 0 has shape \(1, \d+\), a batch, not one example: tokenize without "
     r"return_tensors=\"pt\""),
    ("a batch of one as lists", lambda es: [es[0], {k: [v] for k, v in es[1].items()}],
     r"input_ids of example 1 has shape \(1, \d+\), a batch"),
    ("a class name for a label", lambda es: [dict(e, label="positive") for e in es],
     r"the label of example 0 is text \('positive'\), not a class number"),
]


@pytest.mark.parametrize(("change", "message"), [pytest.param(*case[1:], id=case[0]) for case in NOT_FLATTENED])
def test_examples_the_collator_cannot_flatten_are_refused_in_one_line(tokenizer, change, message):
    with pytest.raises(ValueError, match=message) as refused:
        FlatteningCollator()(change(pair_examples(tokenizer)[:3]))
    assert "\n" not in str(refused.value)


def test_the_flattening_collator_with_mixed_examples_trains_a_classifier_through_the_trainer(tokenizer, tmp_path):
    """flash-attn's kwargs, token types for some examples only, one label each: two Trainer steps."""
    pairs = pair_examples(tokenizer)[:8]
    singles = [{"input_ids": ids} for ids in tokenizer(SENTENCES[:8])["input_ids"]]
    mixed = [example for both in zip(pairs, singles, strict=True) for example in both]
    features = [dict(e, label=i % 2) for i, e in enumerate(mixed)]
    model = tiny_model(tokenizer, ConvAttnForSequenceClassification, num_labels=2)
    before = model.classifier.out_proj.weight.detach().clone()
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=4, max_steps=2, learning_rate=3e-3,
                             save_strategy="no", report_to="none", use_cpu=True, dataloader_num_workers=0, seed=0)
    collator = FlatteningCollator(return_flash_attn_kwargs=True)
    result = Trainer(model=model, args=args, train_dataset=features, data_collator=collator).train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert not torch.equal(model.classifier.out_proj.weight.detach(), before)


def trainer_on(model, features, collator, tmp_path) -> Trainer:
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=4, max_steps=1, save_strategy="no",
                             report_to="none", use_cpu=True, dataloader_num_workers=0, seed=0)
    return Trainer(model=model, args=args, train_dataset=features, data_collator=collator)


@pytest.mark.parametrize(("head", "message"), [
    (ConvAttnForMaskedLM, r"labels equal input_ids at every scored position and no token is masked, so masked-LM "
                          r"training would learn to copy its input; mask the batch with "
                          r"convattn\.data\.flattening\.FlatteningCollator\(masking=DataCollatorForLanguageModeling"),
    (ConvAttnForSequenceClassification, r"labels must hold one label per sequence, shape \(4,\) for the 4 sequences "
                                        r"of this flattened batch; got \(1, \d+\); transformers' "
                                        r"DataCollatorWithFlattening gives token labels, while "
                                        r"convattn\.data\.flattening\.FlatteningCollator keeps one per sequence"),
])
def test_transformers_flattening_collator_in_a_trainer_is_refused_naming_ours(tokenizer, tmp_path, head, message):
    """DataCollatorWithFlattening makes labels of the tokens themselves (the examples' own "label" is dropped): a
    masked LM would silently learn to copy its input, a classifier would get one label per token."""
    features = [{"input_ids": ids, "label": i % 2} for i, ids in enumerate(tokenizer(SENTENCES[:8])["input_ids"])]
    model = tiny_model(tokenizer, head, **({"num_labels": 2} if head is ConvAttnForSequenceClassification else {}))
    with pytest.raises(ValueError, match=message) as refused:
        trainer_on(model, features, DataCollatorWithFlattening(), tmp_path).train()
    assert "\n" not in str(refused.value)


def test_a_masked_batch_with_few_scored_tokens_that_all_kept_their_token_still_trains(tokenizer):
    """BERT's masking keeps the original token at 10 % of the scored positions: a flattened batch whose few scored
    tokens all kept theirs is masked LM, not copying; and evaluation, or a padded batch, may score anything."""
    model = tiny_model(tokenizer, ConvAttnForMaskedLM).train()
    flat = FlatteningCollator()([{"input_ids": ids} for ids in tokenizer(SENTENCES[:2])["input_ids"]])
    ids, positions = flat["input_ids"], flat["position_ids"]
    labels = torch.full_like(ids, -100)
    labels[:, [2, 9]] = ids[:, [2, 9]]
    assert torch.isfinite(model(input_ids=ids, position_ids=positions, labels=labels).loss)
    with pytest.raises(ValueError, match="copy its input"):
        model(input_ids=ids, position_ids=positions, labels=ids)
    assert torch.isfinite(model.eval()(input_ids=ids, position_ids=positions, labels=ids).loss)
    assert torch.isfinite(model.train()(input_ids=ids, labels=ids).loss)  # padded: a test's or benchmark's batch


def test_masking_by_a_collator_that_does_not_mask_is_refused(tokenizer):
    with pytest.raises(ValueError, match=r"has mlm=False .* give one with mlm=True, or leave masking out"):
        FlatteningCollator(masking=DataCollatorForLanguageModeling(tokenizer, mlm=False))


@pytest.mark.parametrize(("batch", "message"), [
    (lambda es: FlatteningCollator()([dict(e, token_type_ids=[2] * len(e["input_ids"])) for e in es]),
     r"token_type_ids holds 2, outside the model's 2 rows \(type_vocab_size=2\): give ids in 0..1"),
    (lambda es: {"input_ids": torch.tensor([[5, 500, 6]])}, r"input_ids holds 500, outside the model's \d+ rows"),
    (lambda es: {"input_ids": torch.zeros(1, 0, dtype=torch.long), "position_ids": torch.zeros(1, 0, dtype=torch.long)},
     r"the batch holds no tokens \(inputs of shape \(1, 0\)\): an empty flattened row"),
])
def test_a_batch_the_model_cannot_embed_is_one_line_naming_the_field(tokenizer, batch, message):
    model = tiny_model(tokenizer)
    with pytest.raises(ValueError, match=message) as refused:
        model(**batch(pair_examples(tokenizer)[:3]))
    assert "\n" not in str(refused.value)
