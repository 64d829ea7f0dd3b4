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
