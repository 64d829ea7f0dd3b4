"""The learning-rate schedule every job asks for: the learning rate at every step of a few pretraining recipes (over
steps and over a time budget) and fine-tuning settings, through each job's own Trainer and arguments, against the
values recorded from the schedules these jobs made before they shared one factory."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from helpers.tiny import tiny_config

from convattn.model import ConvAttnForMaskedLM, ConvAttnForSequenceClassification
from convattn.training.finetune.optim import LayerDecayTrainer
from convattn.training.finetune.settings import FineTuneSettings
from convattn.training.finetune.trainer import fine_tuning_arguments
from convattn.training.pretrain.budget import TrainingClock
from convattn.training.pretrain.callbacks import ThroughputMeter
from convattn.training.pretrain.resolve import resolve_options
from convattn.training.pretrain.trainer import PretrainTrainer, pretraining_arguments
from convattn.training.schedule import lr_factor

pytestmark = pytest.mark.usefixtures("one_thread")

# every parameter group's learning rate at each step of the cases below, as the jobs' schedules gave them before
# every job asked one factory (transformers' linear schedule for steps, the clock's own for a time budget)
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "learning_rates.json"

# the share of the budget spent before each step of a time-budget run (the last past the deadline: the final
# step's overshoot)
BUDGET_FRACTIONS = [0.0, 0.02, 0.05, 0.08, 0.1, 0.3, 0.55, 0.9, 1.0, 1.2]
EVAL = [{}]  # pretraining evaluates on a grid: its Trainer wants an eval set, never read here


def stepped(scheduler, steps: int, before_step=lambda step: None) -> list[list[float]]:
    """Every parameter group's learning rate at each of `steps` steps."""
    rates = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the scheduler steps without the optimizer here
        for step in range(steps):
            if step:
                before_step(step)
                scheduler.step()
            rates.append([group["lr"] for group in scheduler.optimizer.param_groups])
    return rates


def pretraining_trainer(tmp_path, preset: str, training: dict, recipe: str | None = None) -> PretrainTrainer:
    """The pretraining job's Trainer of a tiny composite model for `preset`'s recipe with `training` on top, with the
    job's clock where that recipe has a time budget."""
    options = resolve_options(output_dir=tmp_path, preset=preset, recipe=recipe, training=training, precision="fp32")
    budget = options.recipe.time_budget
    clock = TrainingClock(budget, options.recipe.budget_clock) if budget is not None else None
    return PretrainTrainer(model=ConvAttnForMaskedLM(tiny_config("chang2021-small/composite")),
                           args=pretraining_arguments(options), eval_dataset=EVAL, objective="mlm",
                           throughput=None, clock=clock, warmup=options.recipe.warmup)


def pretraining_rates(tmp_path, preset: str, training: dict, recipe: str | None = None) -> list[list[float]]:
    trainer = pretraining_trainer(tmp_path, preset, training, recipe)
    trainer.create_optimizer_and_scheduler(trainer.args.max_steps)
    return stepped(trainer.lr_scheduler, trainer.args.max_steps + 1)


def budget_rates(tmp_path, preset: str, training: dict) -> dict:
    trainer = pretraining_trainer(tmp_path, preset, training)
    clock = trainer.clock
    trainer.create_optimizer_and_scheduler(1)
    clock.spent = 0.0

    def spend(step: int) -> None:
        clock.spent = BUDGET_FRACTIONS[step] * clock.budget

    return {"warmup": trainer.warmup, "rates": stepped(trainer.lr_scheduler, len(BUDGET_FRACTIONS), spend)}


def fine_tuning_settings(steps: int, **fields) -> FineTuneSettings:
    return FineTuneSettings(**({"learning_rate": 1e-4, "batch_size": 8, "epochs": 1.0, "max_steps": steps,
                                "weight_decay": 0.01, "adam_epsilon": 1e-6, "max_length": 128,
                                "precision": "fp32"} | fields))


def fine_tuning_trainer(tmp_path, steps: int, **fields) -> LayerDecayTrainer:
    """The fine-tuning jobs' Trainer of a tiny composite classifier, seed 0."""
    settings = fine_tuning_settings(steps, **fields)
    model = ConvAttnForSequenceClassification(tiny_config("chang2021-small/composite", num_labels=2))
    return LayerDecayTrainer(model=model, args=fine_tuning_arguments(tmp_path, settings, 0, "glue"),
                             layer_decay=settings.layer_decay)


def fine_tuning_rates(tmp_path, steps: int, **fields) -> list[list[float]]:
    trainer = fine_tuning_trainer(tmp_path, steps, **fields)
    trainer.create_optimizer_and_scheduler(steps)
    return stepped(trainer.lr_scheduler, steps + 1)


CASES = {
    # a paper's warmup scaled to a short run (10k of 125k steps -> 1 of 12)
    "pretrain chang2021-small, 12 steps": lambda tmp: pretraining_rates(tmp, "chang2021-small/composite",
                                                                       {"max_steps": 12}),
    # a fraction of the steps, rounded to the nearest step (2.1 -> 2)
    "pretrain default, 30 steps, warmup 0.07": lambda tmp: pretraining_rates(tmp, None, {"max_steps": 30,
                                                                                         "warmup": 0.07}, "default"),
    "pretrain convbert-small, 9 steps, warmup 3": lambda tmp: pretraining_rates(tmp, "convbert/small",
                                                                               {"max_steps": 9, "warmup": 3}),
    "budget 60 s, warmup 0.1": lambda tmp: budget_rates(tmp, "chang2021-small/composite",
                                                        {"time_budget": 60, "warmup": 0.1}),
    # the recipe's 10k of 1M warmup steps as the same share of the budget
    "budget 600 s, convbert-small's warmup": lambda tmp: budget_rates(tmp, "convbert/small", {"time_budget": 600}),
    # layer-wise decay: one learning rate per depth; a fraction of the steps rounded up (2.5 -> 3)
    "fine-tune 25 steps, warmup 0.1, layer decay 0.8": lambda tmp: fine_tuning_rates(tmp, 25, warmup_ratio=0.1,
                                                                                     layer_decay=0.8),
    "fine-tune 7 steps, no warmup": lambda tmp: fine_tuning_rates(tmp, 7, warmup_ratio=0.0, layer_decay=1.0),
    "fine-tune 40 steps, warmup 0.06 (2.4 -> 3)": lambda tmp: fine_tuning_rates(tmp, 40, warmup_ratio=0.06,
                                                                                layer_decay=0.9),
}


@pytest.mark.parametrize("case", CASES)
def test_every_job_gets_the_learning_rates_it_had_at_every_step(case, tmp_path):
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))[case]
    rates = CASES[case](tmp_path)
    if isinstance(recorded, dict):  # a budget: its warmup share too
        assert rates["warmup"] == recorded["warmup"]
        rates, recorded = rates["rates"], recorded["rates"]
    assert len(rates) == len(recorded)
    for step, (now, then) in enumerate(zip(rates, recorded, strict=True)):
        assert now == pytest.approx(then, rel=1e-12, abs=0), f"step {step}"


def test_the_schedule_warms_up_then_reaches_zero_at_the_deadline():
    assert lr_factor(0.0, 0.1) == 0.0
    assert lr_factor(0.05, 0.1) == pytest.approx(0.5)
    assert lr_factor(0.1, 0.1) == pytest.approx(1.0)
    assert lr_factor(0.55, 0.1) == pytest.approx(0.5)
    assert lr_factor(1.0, 0.1) == 0.0
    assert lr_factor(1.2, 0.1) == 0.0  # past the deadline (the last step's overshoot)


@pytest.mark.parametrize("job", [
    lambda tmp_path: pretraining_trainer(tmp_path, "chang2021-small/composite", {"max_steps": 12}),
    lambda tmp_path: fine_tuning_trainer(tmp_path, 7, warmup_ratio=0.1, layer_decay=0.8),
], ids=["pretrain", "fine-tune"])
def test_every_job_builds_adamw_with_the_papers_settings(job, tmp_path):
    """SPEC 3: AdamW with eps 1e-6, betas (0.9, 0.999) and weight decay 0.01 on every weight, none on biases and
    LayerNorm, in the optimizer each job's Trainer builds (transformers' defaults are eps 1e-8 and no decay)."""
    trainer = job(tmp_path)
    trainer.create_optimizer()
    names = {id(p): name for name, p in trainer.model.named_parameters()}
    seen = set()
    for group in trainer.optimizer.param_groups:
        assert (group["eps"], tuple(group["betas"])) == (1e-6, (0.9, 0.999))
        for p in group["params"]:
            name = names[id(p)]
            seen.add(name)
            decayed = not name.endswith("bias") and "LayerNorm" not in name
            assert group["weight_decay"] == (0.01 if decayed else 0.0), name
    assert seen == {name for name, p in trainer.model.named_parameters() if p.requires_grad}


def test_each_job_hands_the_trainer_its_batch_and_seed(tmp_path):
    """A pretraining step takes the recipe's batch (per device x accumulation steps x processes) with the recipe's
    seed; each fine-tuning seed trains with its own seed."""
    args = pretraining_trainer(tmp_path, "chang2021-small/composite",
                               {"max_steps": 12, "batch_size": 8, "gradient_accumulation": 2, "seed": 5}).args
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.seed) == (4, 2, 5)
    settings = fine_tuning_settings(7, warmup_ratio=0.1, layer_decay=1.0)
    for seed in (0, 3):
        args = fine_tuning_arguments(tmp_path, settings, seed, "glue")
        assert (args.per_device_train_batch_size, args.seed) == (8, seed)


def test_pretraining_counts_the_real_tokens_it_trains_on_not_the_padding(tmp_path):
    """tokens_seen (metrics.jsonl, the report's 'Tokens seen' and the cost figures' x axis) counts each batch's real
    tokens: a batch of short and long pairs is mostly padding."""
    trainer = pretraining_trainer(tmp_path, "chang2021-small/composite", {"max_steps": 2, "batch_size": 4})
    lengths = [30, 5, 3, 7, 2, 31, 4, 6]
    trainer.train_dataset = [{"input_ids": list(range(5, 5 + length))} for length in lengths]

    def padded(features):
        n = max(len(f["input_ids"]) for f in features)
        ids = torch.tensor([f["input_ids"] + [0] * (n - len(f["input_ids"])) for f in features])
        return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": ids.masked_fill(ids == 0, -100)}

    trainer.data_collator, trainer.throughput = padded, ThroughputMeter()
    trainer.args.eval_strategy = trainer.args.save_strategy = "no"
    trainer.args.eval_on_start = False
    trainer.train()
    assert trainer.state.num_input_tokens_seen == sum(lengths)  # 88 real tokens; 4 x 30 + 4 x 31 with padding
