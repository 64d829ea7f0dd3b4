"""peft's LoRA on convattn models, with the one line the docs give (`target_modules="all-linear"`: peft knows no
default modules for a model type it does not list): every attention family trains its adapters and the head only,
the adapter saved and loaded onto the base model computes what the adapted one does, and so does the merged
model."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny import tiny_config

from convattn import ConvAttnForSequenceClassification

peft = pytest.importorskip("peft")

pytestmark = pytest.mark.slow  # fine-tuning runs with LoRA adapters
FAMILIES = ["chang2021-small/composite", "chang2021-small/composite+conv-qkv", "convbert/small",
            "malard/conv-linformer-n512-k128"]


def classifier(preset: str) -> ConvAttnForSequenceClassification:
    torch.manual_seed(0)
    return ConvAttnForSequenceClassification(tiny_config(preset, num_labels=2))


def lora_classifier(preset: str) -> torch.nn.Module:
    return peft.get_peft_model(classifier(preset), peft.LoraConfig(task_type="SEQ_CLS", target_modules="all-linear"))


@pytest.mark.parametrize("preset", FAMILIES)
def test_lora_trains_adapters_and_head_only_and_reloads_and_merges_to_the_same_model(preset, tmp_path):
    model = lora_classifier(preset)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name or ".classifier." in name for name in trainable)
    assert any(".attention.self." in name for name in trainable)  # the attention's own projections are adapted
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(5, 100, (3, 17), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0  # padding
    for _ in range(2):
        model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 1])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(torch.equal(p, frozen[name]) for name, p in model.named_parameters() if name in frozen)
    model.eval()
    with torch.no_grad():
        adapted = model(input_ids=ids, attention_mask=mask).logits
        model.save_pretrained(tmp_path / "adapter")
        reloaded = peft.PeftModel.from_pretrained(classifier(preset), tmp_path / "adapter").eval()
        torch.testing.assert_close(reloaded(input_ids=ids, attention_mask=mask).logits, adapted)
        merged = model.merge_and_unload()
        assert isinstance(merged, ConvAttnForSequenceClassification)
        torch.testing.assert_close(merged(input_ids=ids, attention_mask=mask).logits, adapted, rtol=1e-5, atol=1e-5)
