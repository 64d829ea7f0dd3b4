"""The model factory, the `Trainer` subclass with exact eval perplexity, and its `TrainingArguments`."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import torch
from transformers import PreTrainedTokenizerBase, Trainer, TrainingArguments, set_seed

from convattn.config import ConvAttnConfig
from convattn.console import say, world_size
from convattn.electra import ConvAttnForPreTraining
from convattn.losses import masked_lm_loss
from convattn.model import ConvAttnForMaskedLM
from convattn.remote_code import without_remote_code
from convattn.runs.pretrain import checkpoints_dir
from convattn.training.execution import compile_arguments, precision_flags, settle_launcher, stays_on_cpu
from convattn.training.guards import FiniteTraining
from convattn.training.pretrain.budget import TrainingClock
from convattn.training.pretrain.options import PretrainOptions, per_device_batch
from convattn.training.ranges import MAX_STEPS
from convattn.training.recipes import Recipe, warmup_steps
from convattn.training.schedule import ScheduledTrainer

EVAL_SEED = 1234
# processes that collate the next batches beside a GPU's steps: in the main process a masked batch of 128 pairs took
# 2.1 ms to collate and 1.3 ms to fetch on this CPU (python benchmarks/collate.py), host time between the steps of
# a model the host already keeps waiting (RESULTS 9.6); on a CPU they would take the training's own cores
LOADER_WORKERS = 2
# the Trainer's step count for a run that only its clock ends, evaluates and saves: the step maximum, years of
# training, so the clock ends the run first
CLOCK_ONLY_STEPS = MAX_STEPS


def build_model(recipe: Recipe, config: ConvAttnConfig, tokenizer: PreTrainedTokenizerBase):
    """The run's model from its config (`model_config`), given the tokenizer's vocabulary and special ids."""
    config.update({"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
                   "mask_token_id": tokenizer.mask_token_id})
    if recipe.objective == "electra":  # ELECTRA's model masks for its generator itself
        config.mask_probability = recipe.mlm_probability
    set_seed(recipe.seed)
    return ConvAttnForPreTraining(config) if recipe.objective == "electra" else ConvAttnForMaskedLM(config)


class PretrainTrainer(ScheduledTrainer, FiniteTraining, Trainer):
    """`Trainer` whose evaluation sums token losses over the whole eval set (exact perplexity), and which stops at
    the first non-finite loss; its schedule follows `clock` where a time budget sets one (`ScheduledTrainer`)."""

    def __init__(self, *args, objective: str, throughput, clock: TrainingClock | None = None, warmup: float = 0.0,
                 eval_collator=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_collator = eval_collator  # None: the training collator
        self.objective = objective
        self.throughput = throughput
        self.clock, self.warmup = clock, warmup

    def _save_checkpoint(self, model, trial) -> None:
        with without_remote_code():  # convattn resumes a checkpoint itself: the model folder alone carries the code
            super()._save_checkpoint(model, trial)

    def _issue_warnings_after_load(self, load_result) -> None:
        # a tied weight (the masked-LM decoder, the generator's shared embeddings) is saved once, under the name it
        # is tied to, and loading that name fills both: its absence from a checkpoint is no missing weight (the
        # Trainer's warning said so on every resume)
        tied = getattr(self.model, "all_tied_weights_keys", None) or {}
        super()._issue_warnings_after_load(SimpleNamespace(
            missing_keys=[key for key in load_result.missing_keys if key not in tied],
            unexpected_keys=load_result.unexpected_keys))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            logs["tokens_per_second"] = self.throughput.rate()
        super().log(logs, start_time)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.objective == "mlm" and not return_outputs:
            inputs = {**inputs, "return_logits": False}  # through the (possibly wrapped) model: DDP still syncs
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        started = time.perf_counter()
        model = self.model
        was_training = model.training
        model.eval()
        totals: dict[str, torch.Tensor] = {}
        # evaluation must not move the training RNG (exact resume); ELECTRA draws the same masks each time
        devices = [self.args.device] if self.args.device.type == "cuda" else []
        train_collator = self.data_collator
        self.data_collator = self.eval_collator or train_collator
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                torch.manual_seed(EVAL_SEED)
                for batch in self.get_eval_dataloader(eval_dataset):
                    batch = self._prepare_inputs(batch)
                    with self.autocast_smart_context_manager():
                        sums = self._eval_sums(model, batch)
                    # per-example values: gather_for_metrics drops the repeats that even out the shards
                    gather = self.accelerator.gather_for_metrics if self.objective == "mlm" else self.accelerator.gather
                    for name, value in sums.items():
                        totals[name] = totals.get(name, 0) + gather(value).double().sum()
        finally:
            model.train(was_training)
            self.data_collator = train_collator
        metrics = self._eval_metrics({k: float(v) for k, v in totals.items()}, metric_key_prefix)
        self.check_finite_eval(metrics[f"{metric_key_prefix}_loss"])
        metrics[f"{metric_key_prefix}_runtime"] = round(time.perf_counter() - started, 3)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        return metrics

    def _eval_sums(self, model, batch: dict) -> dict[str, torch.Tensor]:
        """Per-example sums (so `gather_for_metrics` can drop the padding of uneven shards)."""
        if self.objective == "mlm":
            labels = batch.pop("labels")
            hidden = model.convattn(**batch).last_hidden_state
            loss = masked_lm_loss(model.mlm_head, hidden, labels, reduction="per_example")
            return {"loss": loss, "tokens": (labels != -100).sum(1)}
        out = model(**batch)
        # ELECTRA reports batch means: the generator's over the tokens the batch masked, the discriminator's over its
        # real tokens; weigh each by its own count
        real, masked = batch["attention_mask"].sum().double(), out.masked.sum().double()
        sums = {"generator_loss": out.generator_loss.double() * masked}
        for name in ("discriminator_loss", "discriminator_accuracy"):
            sums[name] = getattr(out, name).double() * real
        return {name: value.reshape(1) for name, value in (sums | {"tokens": real, "masked_tokens": masked}).items()}

    def _eval_metrics(self, totals: dict[str, float], prefix: str) -> dict[str, float]:
        tokens = max(totals.pop("tokens"), 1.0)
        masked = max(totals.pop("masked_tokens", tokens), 1.0)  # ELECTRA's generator loss is a mean over these
        metrics = {f"{prefix}_{name}": value / (masked if name == "generator_loss" else tokens)
                   for name, value in totals.items()}
        if self.objective == "mlm":
            mlm_loss = metrics[f"{prefix}_loss"]
        else:
            mlm_loss = metrics[f"{prefix}_generator_loss"]
            metrics[f"{prefix}_loss"] = self.model.combined_loss(mlm_loss, metrics[f"{prefix}_discriminator_loss"])
        metrics[f"{prefix}_perplexity"] = math.exp(min(mlm_loss, 50.0))
        metrics[f"{prefix}_tokens"] = tokens
        return metrics


def loader_workers(use_cpu: bool) -> int:
    """The data loader's worker processes: LOADER_WORKERS where the model trains on a GPU, none on a CPU. The
    batches are the same either way (the sampler stays in the main process, the masks are seeded from the
    tokens)."""
    return 0 if use_cpu or not torch.cuda.is_available() else LOADER_WORKERS


def pretraining_arguments(options: PretrainOptions) -> TrainingArguments:
    """The run's TrainingArguments; made before the output folder is read (they join a multi-process run's
    processes), so they evaluate the start, which the caller turns off for a resumed run."""
    recipe = options.recipe
    flags = precision_flags(options.precision)
    if note := settle_launcher(flags, processes=world_size()):  # before TrainingArguments reads the launcher's
        say("pretrain", f"warning: {note}")
    use_cpu = stays_on_cpu(flags["bf16"], processes=world_size())
    workers = loader_workers(use_cpu)
    return TrainingArguments(
        output_dir=str(checkpoints_dir(options.output_dir)),
        max_steps=CLOCK_ONLY_STEPS if recipe.max_steps is None else recipe.max_steps,
        per_device_train_batch_size=per_device_batch(recipe),
        per_device_eval_batch_size=per_device_batch(recipe) * recipe.gradient_accumulation,
        gradient_accumulation_steps=recipe.gradient_accumulation,
        learning_rate=recipe.learning_rate,
        weight_decay=recipe.weight_decay,
        adam_epsilon=recipe.adam_epsilon,
        adam_beta1=recipe.adam_beta1,
        adam_beta2=recipe.adam_beta2,
        optim="adamw_torch_fused",  # one kernel for all parameters: 2.5 ms a step against 15.5 (5.3M, CPU)
        # no lr_scheduler_type: the schedule is ScheduledTrainer's (training/schedule.py), which does not read it
        # the steps `check_options` checked and the schedule line says (the Trainer's own rounding of a fraction is
        # up: a 1-step run would warm up over its only step, at learning rate 0); a budget's clock warms up itself
        warmup_steps=0 if recipe.time_budget else warmup_steps(recipe),
        max_grad_norm=recipe.max_grad_norm,
        seed=recipe.seed,
        data_seed=recipe.seed,
        eval_strategy="steps",
        eval_steps=CLOCK_ONLY_STEPS if recipe.time_budget else recipe.eval_every,  # a budget's grid is the clock's
        eval_on_start=True,
        logging_steps=min(options.log_every, recipe.eval_every),
        save_strategy="steps",
        save_steps=CLOCK_ONLY_STEPS if recipe.time_budget else recipe.save_every,
        save_total_limit=2,
        include_num_input_tokens_seen="non_padding",
        remove_unused_columns=False,
        dataloader_num_workers=workers,
        dataloader_persistent_workers=workers > 0,  # started once, not at each evaluation
        ddp_find_unused_parameters=False,
        dataloader_pin_memory=torch.cuda.is_available(),
        report_to="none",
        disable_tqdm=False,
        **compile_arguments(options.compile, "pretrain"),
        use_cpu=use_cpu,
        **flags,
    )
