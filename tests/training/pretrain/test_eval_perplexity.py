"""The eval perplexity a pretraining run reports, against a float64 computation of its definition: exp(the sum of
every scored token's loss / the number of scored tokens) over the whole eval set, with batches of several sizes
(the last one partial) and examples of odd, different lengths, dropout on in the config (evaluation turns it off).
For ELECTRA the generator's tokens are the ones each batch masked, which the batch's real tokens do not weigh."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from helpers.tiny import tiny_config
from transformers import TrainingArguments

from convattn import ConvAttnConfig
from convattn.electra import ConvAttnForPreTraining
from convattn.model import ConvAttnForMaskedLM
from convattn.training.pretrain.trainer import EVAL_SEED, PretrainTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

MASK, CLS, SEP, PAD = 3, 1, 2, 0
# odd lengths, long and short apart, so that batches of 3 differ in their share of masked tokens
LENGTHS = [29, 31, 27, 7, 9, 5, 13]
BATCH = 3


def examples(vocab: int) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    return [{"input_ids": [CLS, *torch.randint(4, vocab, (length - 2,), generator=generator).tolist(), SEP]}
            for length in LENGTHS]


def scored(ids: list[int]) -> list[int]:
    """The positions a fixed masking scores: every third token but [CLS] and [SEP]."""
    return [t for t in range(1, len(ids) - 1) if t % 3 == 1]


def padding(features: list[dict]) -> dict:
    """What ELECTRA's collator gives: padded ids, attention and special-tokens masks (no labels)."""
    n = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), n), PAD)
    for row, feature in enumerate(features):
        ids[row, :len(feature["input_ids"])] = torch.tensor(feature["input_ids"])
    return {"input_ids": ids, "attention_mask": (ids != PAD).long(),
            "special_tokens_mask": ((ids == CLS) | (ids == SEP)).long()}


def fixed_masking(features: list[dict]) -> dict:
    """The padded batch with fixed masks ([MASK] where scored, labels there, -100 elsewhere)."""
    padded = padding(features)
    ids = padded["input_ids"]
    labels = torch.full_like(ids, -100)
    for row, feature in enumerate(features):
        for t in scored(feature["input_ids"]):
            labels[row, t] = ids[row, t]
            ids[row, t] = MASK
    return {"input_ids": ids, "attention_mask": padded["attention_mask"], "labels": labels}


def trainer_for(model, objective: str, collator, tmp_path, eval_collator=None) -> PretrainTrainer:
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=BATCH, report_to=[], use_cpu=True)
    return PretrainTrainer(model=model, args=args, eval_dataset=examples(model.config.vocab_size),
                           objective=objective, throughput=None, data_collator=collator, eval_collator=eval_collator)


def test_masked_lm_perplexity_is_the_token_mean_over_the_whole_eval_set(tmp_path):
    config = tiny_config("chang2021-small/composite", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                         mask_token_id=MASK, pad_token_id=PAD)
    torch.manual_seed(0)
    model = ConvAttnForMaskedLM(config).train()
    reference = copy.deepcopy(model).double().eval()
    metrics = trainer_for(model, "mlm", fixed_masking, tmp_path).evaluate()
    assert model.training  # evaluation leaves the model as it found it

    total, count = 0.0, 0
    with torch.no_grad():
        for example in examples(config.vocab_size):  # one at a time: no padding, no batch
            batch = fixed_masking([example])
            logits = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[0]
            for t in scored(example["input_ids"]):
                total -= F.log_softmax(logits[t], -1)[example["input_ids"][t]].item()
                count += 1
    assert metrics["eval_tokens"] == count
    assert metrics["eval_loss"] == pytest.approx(total / count, rel=1e-5)
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)


def test_evaluation_leaves_the_training_random_state_as_it_found_it(tmp_path):
    """An evaluation draws with its own seed (the same masks and dropout-free model every time) and gives training
    its random state back: without that, every evaluation would set training's draws back to the same point."""
    config = tiny_config("chang2021-small/composite", mask_token_id=MASK, pad_token_id=PAD)
    model = ConvAttnForMaskedLM(config).train()
    trainer = trainer_for(model, "mlm", fixed_masking, tmp_path)
    torch.manual_seed(7)
    before = torch.random.get_rng_state()
    trainer.evaluate()
    assert torch.equal(torch.random.get_rng_state(), before)


def test_evaluation_masks_with_the_eval_collator_and_gives_training_its_collator_back(tmp_path):
    """A run evaluates with its own collator (the job's masks one example at a time, so the perplexity does not
    move with the batch or the processes), not the training one, which it gets back afterwards."""
    config = tiny_config("chang2021-small/absolute", mask_token_id=MASK, pad_token_id=PAD)
    torch.manual_seed(0)
    model = ConvAttnForMaskedLM(config)

    def training_collator(features):
        raise AssertionError("evaluation used the training collator")

    trainer = trainer_for(model, "mlm", training_collator, tmp_path, eval_collator=fixed_masking)
    metrics = trainer.evaluate()
    assert trainer.data_collator is training_collator
    alone = trainer_for(model, "mlm", fixed_masking, tmp_path).evaluate()
    assert metrics["eval_loss"] == alone["eval_loss"] and metrics["eval_tokens"] == alone["eval_tokens"]


def test_electra_generator_perplexity_weighs_each_batch_by_its_masked_tokens(tmp_path):
    config = ConvAttnConfig.from_preset("convbert/small", vocab_size=40, embedding_size=16, hidden_size=32,
                                        num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
                                        max_position_embeddings=64, mask_token_id=MASK, pad_token_id=PAD)
    torch.manual_seed(0)
    model = ConvAttnForPreTraining(config)
    trainer = trainer_for(model, "electra", padding, tmp_path)
    metrics = trainer.evaluate()

    # the same batches with the masks evaluation draws (its seed, then its loader), each batch's means taken apart
    generator, discriminator, accuracy, masked, real = [], [], [], [], []
    model.eval()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(EVAL_SEED)
        for batch in trainer.get_eval_dataloader():
            assert len(batch["input_ids"]) <= BATCH
            out = model(**batch)
            generator.append(out.generator_loss.item())
            discriminator.append(out.discriminator_loss.item())
            accuracy.append(out.discriminator_accuracy.item())
            masked.append(out.masked.sum().item())
            real.append(batch["attention_mask"].sum().item())
    assert len(set(m / r for m, r in zip(masked, real, strict=True))) > 1  # batches whose weights tell the two apart

    def mean(values, weights):
        return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)

    generator_loss = mean(generator, masked)
    assert metrics["eval_generator_loss"] == pytest.approx(generator_loss, rel=1e-6)
    assert metrics["eval_generator_loss"] != pytest.approx(mean(generator, real), rel=1e-4)
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(generator_loss), rel=1e-6)
    assert metrics["eval_discriminator_loss"] == pytest.approx(mean(discriminator, real), rel=1e-6)
    assert metrics["eval_discriminator_accuracy"] == pytest.approx(mean(accuracy, real), rel=1e-6)
    assert metrics["eval_loss"] == pytest.approx(
        generator_loss + config.discriminator_weight * mean(discriminator, real), rel=1e-6)
    assert metrics["eval_tokens"] == sum(real)


def test_perplexity_at_a_length_scores_body_tokens_only_against_float64():
    """The length evaluation (`convattn compare --eval-lengths`): [MASK] replaces the tokens the mask it is given
    selects (evaluate_at_lengths never selects [CLS] or [SEP]), and the perplexity is exp(the masked tokens' summed
    loss / their count), here recomputed in float64 one block at a time from the inputs the model was given (batches
    of 3, the last partial)."""
    from convattn.training.length_eval import perplexity_at

    model = ConvAttnForMaskedLM(tiny_config("chang2021-small/composite")).eval()
    generator = torch.Generator().manual_seed(0)
    blocks = torch.cat([torch.full((40, 1), CLS), torch.randint(4, 101, (40, 9), generator=generator),
                        torch.full((40, 1), SEP)], dim=1)
    given = []
    model.convattn.register_forward_pre_hook(lambda _, args, kwargs: given.append(kwargs["input_ids"]),
                                             with_kwargs=True)
    selected = torch.rand(blocks.shape, generator=torch.Generator().manual_seed(5)) < 0.15
    selected[:, [0, -1]] = False
    perplexity, count = perplexity_at(model.convattn, model.mlm_head, MASK, blocks, selected, batch_size=3)
    inputs = torch.cat(given)
    masked = inputs == MASK
    assert torch.equal(masked, selected) and torch.equal(inputs[~masked], blocks[~masked])
    assert count == int(masked.sum()) and 0.08 < count / blocks[:, 1:-1].numel() < 0.22  # 15 % of 360 tokens
    reference = copy.deepcopy(model).double()
    total = 0.0
    with torch.no_grad():
        for row in range(len(blocks)):
            logits = reference(input_ids=inputs[row:row + 1]).logits[0]
            total += F.cross_entropy(logits[masked[row]], blocks[row][masked[row]], reduction="sum").item()
    assert perplexity == pytest.approx(math.exp(total / count), rel=1e-5)


def test_a_diverged_models_perplexity_at_a_length_is_capped_not_an_overflow():
    """A mean loss past 50 nats (here about 10^4: every guess is [PAD], which no block holds) reads exp(50); exp of
    the loss itself overflows a float."""
    from convattn.training.length_eval import perplexity_at

    model = ConvAttnForMaskedLM(tiny_config("chang2021-small/composite")).eval()
    with torch.no_grad():
        model.mlm_head.bias[PAD] = 1e4
    generator = torch.Generator().manual_seed(0)
    blocks = torch.cat([torch.full((6, 1), CLS), torch.randint(4, 101, (6, 9), generator=generator),
                        torch.full((6, 1), SEP)], dim=1)
    selected = torch.zeros_like(blocks, dtype=torch.bool)
    selected[:, 1:-1] = True
    perplexity, count = perplexity_at(model.convattn, model.mlm_head, MASK, blocks, selected, batch_size=4)
    assert count > 0 and perplexity == math.exp(50.0)


@pytest.mark.parametrize("lengths", [[128, 2], [64.0]])
def test_a_length_below_three_or_not_an_integer_is_refused_before_any_model_loads(lengths, tmp_path):
    from convattn.training.length_eval import evaluate_at_lengths

    with pytest.raises(ValueError, match=r"must be integers >= 3 \(\[CLS\] \+ at least one token \+ \[SEP\]\)"):
        evaluate_at_lengths(tmp_path / "no-model", ["some text"], lengths)


def test_non_finite_weights_stop_an_evaluation_and_are_never_saved(tmp_path):
    from convattn.training.guards import NonFiniteTraining

    config = tiny_config("chang2021-small/composite", mask_token_id=MASK, pad_token_id=PAD)
    model = ConvAttnForMaskedLM(config).train()
    trainer = trainer_for(model, "mlm", fixed_masking, tmp_path / "run")
    with torch.no_grad():
        model.mlm_head.bias[0] = float("inf")
    with pytest.raises(NonFiniteTraining, match="the eval loss is nan"):
        trainer.evaluate()
    with pytest.raises(NonFiniteTraining, match=r"the weights are no longer finite \(mlm_head.bias\)"):
        trainer.save_model(str(tmp_path / "saved"))
    assert not (tmp_path / "saved").exists()
