"""Pretraining: corpus -> tokenizer -> formatted, cached data -> `Trainer` -> a saved encoder.

Everything the user can get wrong (files, vocabulary, sequence length, preset, output directory) is
checked before the output directory is touched. The output directory then holds:

    config.json, model.safetensors, tokenizer files   the final model (AutoModelForMaskedLM loads it)
    metrics.jsonl                                     one row per evaluation
    perplexity.png                                    eval perplexity vs steps
    tensorboard/                                      TensorBoard event files
    checkpoints/checkpoint-N/                         for --resume (Trainer's own checkpoints)
    pretrain_options.json                             what was run (checked again on --resume)

Eval perplexity is exp(total token loss / total masked tokens) over the whole eval set; masks are drawn
from a generator seeded by each batch's tokens, so every evaluation scores the same positions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    PreTrainedTokenizerBase,
    ProgressCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)
from transformers.integrations import TensorBoardCallback

from convattn.config import ConvAttnConfig
from convattn.data.corpus import load_corpus
from convattn.data.formatting import FORMATS, cache_key, cached_format
from convattn.data.tokenizer import check_vocab_size, load_tokenizer, tokenizer_fingerprint, trained_tokenizer
from convattn.errors import UsageError
from convattn.hub import write_model_card
from convattn.training.recipes import Recipe

OBJECTIVES = ("mlm", "electra")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
EVAL_SEED = 1234
OPTIONS_FILE = "pretrain_options.json"
METRICS_FILE = "metrics.jsonl"
# options that may change between a run and its --resume without changing what is computed
RESUMABLE_CHANGES = ("max_steps", "eval_every", "save_every", "output_dir", "resume", "overwrite", "log_every",
                     "cache_dir")


def default_cache_dir() -> Path:
    return Path(os.environ.get("CONVATTN_CACHE", Path.home() / ".cache" / "convattn"))


@dataclass
class PretrainOptions:
    recipe: Recipe
    output_dir: Path
    dataset: str | None = None
    dataset_config: str | None = None
    train_files: list[str] = field(default_factory=list)
    eval_files: list[str] = field(default_factory=list)
    tokenizer: str | None = None
    cache_dir: Path = field(default_factory=default_cache_dir)
    precision: str = "auto"
    log_every: int = 10
    resume: bool = False
    overwrite: bool = False

    def to_json(self) -> dict:
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "recipe"}
        fields.update(dataclasses.asdict(self.recipe))
        return json.loads(json.dumps(fields, default=str))


# ---------------------------------------------------------------------------------- checks
def check_options(options: PretrainOptions) -> ConvAttnConfig:
    """Validate what can be validated before reading the corpus; returns the model config (recipe vocab)."""
    recipe = options.recipe
    if recipe.objective not in OBJECTIVES:
        raise UsageError(f"--objective {recipe.objective!r} is not known; choose one of {', '.join(OBJECTIVES)}")
    if recipe.format not in FORMATS:
        raise UsageError(f"--format {recipe.format!r} is not known; choose one of {', '.join(FORMATS)}")
    if options.precision not in PRECISIONS:
        raise UsageError(f"--precision {options.precision!r} is not known; choose one of {', '.join(PRECISIONS)}")
    for flag, value in (("--batch-size", recipe.batch_size), ("--max-steps", recipe.max_steps),
                        ("--eval-every", recipe.eval_every), ("--save-every", recipe.save_every),
                        ("--gradient-accumulation", recipe.gradient_accumulation), ("--log-every", options.log_every)):
        if value < 1:
            raise UsageError(f"{flag} {value} must be at least 1")
    if not 0 < recipe.mlm_probability < 1:
        raise UsageError(f"--mlm-probability {recipe.mlm_probability} must be between 0 and 1")
    if recipe.learning_rate <= 0:
        raise UsageError(f"--lr {recipe.learning_rate} must be positive")
    if options.tokenizer is None:
        check_vocab_size(recipe.vocab_size)
    config = ConvAttnConfig.from_preset(recipe.preset, **recipe.model)
    seq_len = recipe.seq_len or config.max_position_embeddings
    if seq_len > config.max_position_embeddings:
        raise UsageError(
            f"--seq-len {seq_len} is above the model's maximum of {config.max_position_embeddings} positions "
            f"(preset {recipe.preset}); lower --seq-len or raise --max-len"
        )
    if seq_len < 8:
        raise UsageError(f"--seq-len {seq_len} is too short; use at least 8 tokens (the papers use 128)")
    return config


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def per_device_batch(recipe: Recipe) -> int:
    processes = world_size() * recipe.gradient_accumulation
    if recipe.batch_size % processes:
        raise UsageError(
            f"--batch-size {recipe.batch_size} must divide evenly over {world_size()} process(es) x "
            f"{recipe.gradient_accumulation} accumulation step(s); change --batch-size or --gradient-accumulation"
        )
    return recipe.batch_size // processes


def complete_checkpoints(directory: Path) -> list[Path]:
    """Checkpoints whose trainer state was written (Trainer writes it last), oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.glob("checkpoint-*")
             if p.name.removeprefix("checkpoint-").isdigit() and (p / "trainer_state.json").exists()]
    return sorted(found, key=lambda p: int(p.name.removeprefix("checkpoint-")))


def check_output_dir(options: PretrainOptions) -> Path | None:
    """The checkpoint to resume from (None for a fresh run); raises if the directory is in the way."""
    out = options.output_dir
    if options.resume:
        checkpoints = complete_checkpoints(out / "checkpoints")
        if not checkpoints:
            raise UsageError(f"--resume: {out} has no complete checkpoint to resume from; drop --resume to start")
        saved = json.loads((out / OPTIONS_FILE).read_text()) if (out / OPTIONS_FILE).exists() else {}
        current = options.to_json()
        changed = sorted(k for k in set(saved) | set(current)
                         if k not in RESUMABLE_CHANGES and saved.get(k) != current.get(k))
        if changed:
            details = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in changed)
            raise UsageError(f"--resume: options differ from the run in {out} ({details}); repeat its options")
        return checkpoints[-1]
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output-dir {out} is a file; choose a directory")
    if out.is_dir() and any(out.iterdir()) and not options.overwrite:
        raise UsageError(
            f"--output-dir {out} is not empty; continue that run with --resume, replace it with --overwrite, "
            "or choose another --output-dir"
        )
    return None


# ---------------------------------------------------------------------------------- data
@dataclass
class PretrainData:
    tokenizer: PreTrainedTokenizerBase
    train: object  # datasets.Dataset
    eval: object
    corpus: str
    seq_len: int


def say(message: str) -> None:
    """A progress line on stderr, from the main process only."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"convattn pretrain: {message}", file=sys.stderr, flush=True)


def prepare_data(options: PretrainOptions, seq_len: int, resume_from: Path | None) -> PretrainData:
    recipe, cache = options.recipe, options.cache_dir
    say("reading the corpus" + ("" if options.dataset or options.train_files else
                                " (first run: extracting the embedded default from installed documentation)"))
    corpus = load_corpus(options.dataset, options.dataset_config, options.train_files, options.eval_files, cache)
    say(f"corpus: {corpus.description}; {len(corpus.train):,} train / {len(corpus.eval):,} eval lines")
    if options.tokenizer:
        tokenizer = load_tokenizer(options.tokenizer)
    elif resume_from is not None and (resume_from / "tokenizer.json").exists():
        tokenizer = load_tokenizer(resume_from)
    else:
        say(f"tokenizer: unigram, {recipe.vocab_size:,} pieces (trained once per corpus, then cached)")
        tokenizer = trained_tokenizer(corpus.train, corpus.identity, recipe.vocab_size, seq_len, cache)
    key = cache_key(corpus.identity, tokenizer_fingerprint(tokenizer), recipe.format, seq_len)
    directory = cache / "formatted" / key
    say(f"formatting: {recipe.format}, {seq_len} tokens (cached in {directory})")
    train = cached_format(corpus.train, tokenizer, recipe.format, seq_len, directory / "train")
    evaluation = cached_format(corpus.eval, tokenizer, recipe.format, seq_len, directory / "eval")
    if recipe.eval_samples:
        evaluation = evaluation.select(range(min(recipe.eval_samples, len(evaluation))))
    say(f"data: {len(train):,} train / {len(evaluation):,} eval examples")
    return PretrainData(tokenizer, train, evaluation, corpus.description, seq_len)


@dataclass
class MaskingCollator:
    """Pads and masks (15%, 80/10/10, never special or pad tokens) with a generator seeded from the batch's
    tokens, so masks do not depend on the global RNG: a resumed run masks exactly as the uninterrupted
    one, and each evaluation scores the same positions."""

    tokenizer: PreTrainedTokenizerBase
    mlm_probability: float
    seed: int

    def __post_init__(self):
        self.masking = DataCollatorForLanguageModeling(self.tokenizer, mlm_probability=self.mlm_probability,
                                                       pad_to_multiple_of=8)

    def __call__(self, features: list[dict]) -> dict:
        digest = hashlib.sha256(str(self.seed).encode())
        for feature in features:
            digest.update(np.asarray(feature["input_ids"], dtype=np.int64).tobytes())
        self.masking.generator = torch.Generator().manual_seed(int.from_bytes(digest.digest()[:8], "little") >> 1)
        return self.masking(features)


def padding_collator(tokenizer: PreTrainedTokenizerBase) -> DataCollatorWithPadding:
    """ELECTRA masks inside the model; its batches are only padded (special_tokens_mask included)."""
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)


# ---------------------------------------------------------------------------------- model
def build_model(recipe: Recipe, tokenizer: PreTrainedTokenizerBase):
    config = ConvAttnConfig.from_preset(
        recipe.preset, **{**recipe.model, "vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
                          "mask_token_id": tokenizer.mask_token_id},
    )
    set_seed(recipe.seed)
    if recipe.objective == "electra":
        try:
            from convattn.electra import ConvAttnForPreTraining
        except ImportError as err:
            raise UsageError(f"--objective electra is not available in this install ({err})") from None
        return ConvAttnForPreTraining(config)
    from convattn.model import ConvAttnForMaskedLM

    return ConvAttnForMaskedLM(config)


# ---------------------------------------------------------------------------------- trainer
class PretrainTrainer(Trainer):
    """`Trainer` whose evaluation sums token losses over the whole eval set (exact perplexity)."""

    def __init__(self, *args, objective: str, throughput: ThroughputMeter, **kwargs):
        super().__init__(*args, **kwargs)
        self.objective = objective
        self.throughput = throughput

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            logs["tokens_per_second"] = self.throughput.rate()
        super().log(logs, start_time)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        started = time.perf_counter()
        model = self.model
        was_training = model.training
        model.eval()
        totals: dict[str, torch.Tensor] = {}
        # evaluation must not move the training RNG (exact resume); ELECTRA draws the same masks each time
        devices = [self.args.device] if self.args.device.type == "cuda" else []
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
        metrics = self._eval_metrics({k: float(v) for k, v in totals.items()}, metric_key_prefix)
        metrics[f"{metric_key_prefix}_runtime"] = round(time.perf_counter() - started, 3)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        return metrics

    def _eval_sums(self, model, batch: dict) -> dict[str, torch.Tensor]:
        """Per-example sums (so `gather_for_metrics` can drop the padding of uneven shards)."""
        if self.objective == "mlm":
            labels = batch.pop("labels")
            hidden = model.convattn(**batch).last_hidden_state
            selected = labels != -100
            token_loss = F.cross_entropy(model.mlm_head(hidden[selected]).float(), labels[selected], reduction="none")
            example_loss = torch.zeros(labels.shape[0], device=labels.device, dtype=torch.float64)
            example_loss.index_add_(0, selected.nonzero()[:, 0], token_loss.double())
            return {"loss": example_loss, "tokens": selected.sum(1)}
        out = model(**batch)
        # ELECTRA reports batch means: weight each by the batch's tokens
        tokens = batch["attention_mask"].sum().double()
        names = ("loss", "generator_loss", "discriminator_loss", "discriminator_accuracy")
        sums = {name: (getattr(out, name).double() * tokens).reshape(1) for name in names}
        return sums | {"tokens": tokens.reshape(1)}

    def _eval_metrics(self, totals: dict[str, float], prefix: str) -> dict[str, float]:
        tokens = max(totals.pop("tokens"), 1.0)
        metrics = {f"{prefix}_{name}": value / tokens for name, value in totals.items()}
        mlm_loss = metrics[f"{prefix}_loss"] if self.objective == "mlm" else metrics[f"{prefix}_generator_loss"]
        metrics[f"{prefix}_perplexity"] = math.exp(min(mlm_loss, 50.0))
        metrics[f"{prefix}_tokens"] = tokens
        return metrics


class ThroughputMeter(TrainerCallback):
    """Tokens per second of training steps only (intervals containing an evaluation or save are left out)."""

    def __init__(self):
        self._last: tuple[float, int] | None = None
        self._skip_next = False
        self._seconds = 0.0
        self._tokens = 0

    def on_step_end(self, args, state, control, **kwargs):
        now, seen = time.perf_counter(), state.num_input_tokens_seen
        if self._last is not None and not self._skip_next:
            self._seconds += now - self._last[0]
            self._tokens += seen - self._last[1]
        self._last, self._skip_next = (now, seen), False

    def on_evaluate(self, args, state, control, **kwargs):
        self._skip_next = True

    def on_save(self, args, state, control, **kwargs):
        self._skip_next = True

    def rate(self) -> float:
        rate = self._tokens / self._seconds if self._seconds > 0 else 0.0
        self._seconds, self._tokens = 0.0, 0
        return round(rate, 1)


class MetricsWriter(TrainerCallback):
    """metrics.jsonl (one row per evaluation) and perplexity.png, rewritten after each evaluation."""

    def __init__(self, output_dir: Path):
        self.path = output_dir / METRICS_FILE
        self.plot_path = output_dir / "perplexity.png"
        self.rows = [json.loads(line) for line in self.path.read_text().splitlines()] if self.path.exists() else []
        self._train: list[dict] = []
        self._started = time.perf_counter()

    def keep_until(self, step: int) -> None:
        """On resume: forget rows after the checkpoint (they will be computed again)."""
        self.rows = [row for row in self.rows if row["step"] <= step]
        self._write()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "loss" in logs:
            self._train.append(logs)
        if "eval_loss" in logs:
            recent = self._train
            row = {
                "step": state.global_step,
                "train_loss": round(sum(r["loss"] for r in recent) / len(recent), 5) if recent else None,
                "eval_loss": round(logs["eval_loss"], 5),
                "perplexity": round(logs["eval_perplexity"], 3),
                "tokens_per_second": recent[-1]["tokens_per_second"] if recent else None,
                "learning_rate": recent[-1].get("learning_rate") if recent else None,
                "tokens_seen": state.num_input_tokens_seen,
                "elapsed_seconds": round(time.perf_counter() - self._started, 1),
            }
            row |= {k.removeprefix("eval_"): round(v, 5) for k, v in logs.items()
                    if k.startswith("eval_") and k.removeprefix("eval_") in ("generator_loss", "discriminator_loss",
                                                                             "discriminator_accuracy")}
            self.rows = [r for r in self.rows if r["step"] != row["step"]] + [row]
            self._train = []
            self._write()

    def _write(self) -> None:
        write_atomic(self.path, "".join(json.dumps(row) + "\n" for row in self.rows))
        if self.rows:
            plot_perplexity(self.rows, self.plot_path)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def plot_perplexity(rows: Sequence[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["step"] for r in rows], [r["perplexity"] for r in rows], marker="o", markersize=3)
    ax.set(xlabel="step", ylabel="eval perplexity", yscale="log", title="Eval perplexity (masked LM)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


class PretrainProgress(ProgressCallback):
    """The Trainer's progress bar (steps, ETA) with loss, tokens/s and eval perplexity as its postfix."""

    def __init__(self):
        super().__init__()
        self.postfix: dict[str, str] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs:
            if "loss" in logs:
                self.postfix |= {"loss": f"{logs['loss']:.3f}", "tok/s": f"{logs['tokens_per_second']:.0f}"}
            if "eval_perplexity" in logs:
                self.postfix["eval_ppl"] = f"{logs['eval_perplexity']:.1f}"
            self.training_bar.set_postfix(self.postfix, refresh=False)


def precision_flags(precision: str) -> dict:
    if precision == "auto":
        gpu = torch.cuda.is_available()
        precision = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if gpu else "fp32"
    if precision != "fp32" and not torch.cuda.is_available():
        raise UsageError(f"--precision {precision} needs a GPU here; use --precision fp32 (or auto) on CPU")
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


def training_arguments(options: PretrainOptions, resuming: bool) -> TrainingArguments:
    recipe = options.recipe
    warmup = recipe.warmup if recipe.warmup < 1 else int(recipe.warmup)
    return TrainingArguments(
        output_dir=str(options.output_dir / "checkpoints"),
        max_steps=recipe.max_steps,
        per_device_train_batch_size=per_device_batch(recipe),
        per_device_eval_batch_size=per_device_batch(recipe) * recipe.gradient_accumulation,
        gradient_accumulation_steps=recipe.gradient_accumulation,
        learning_rate=recipe.learning_rate,
        weight_decay=recipe.weight_decay,
        adam_epsilon=recipe.adam_epsilon,
        adam_beta1=recipe.adam_beta1,
        adam_beta2=recipe.adam_beta2,
        optim="adamw_torch",
        lr_scheduler_type="linear",
        warmup_steps=warmup,
        max_grad_norm=recipe.max_grad_norm,
        seed=recipe.seed,
        data_seed=recipe.seed,
        eval_strategy="steps",
        eval_steps=recipe.eval_every,
        eval_on_start=not resuming,
        logging_steps=min(options.log_every, recipe.eval_every),
        save_strategy="steps",
        save_steps=recipe.save_every,
        save_total_limit=2,
        include_num_input_tokens_seen="non_padding",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,
        dataloader_pin_memory=torch.cuda.is_available(),
        report_to="none",
        disable_tqdm=False,
        # several processes without GPUs: CPU data parallel over gloo (accelerate decides only when told)
        use_cpu=world_size() > 1 and not torch.cuda.is_available(),
        **precision_flags(options.precision),
    )


# ---------------------------------------------------------------------------------- the run
@dataclass
class PretrainSummary:
    output_dir: Path
    parameters: int
    tokens_seen: int
    steps: int
    first_perplexity: float | None
    final_perplexity: float | None
    seconds: float
    corpus: str
    interrupted: bool = False

    def lines(self) -> list[str]:
        ppl = (f"{self.first_perplexity:,.1f} -> {self.final_perplexity:,.1f}"
               if self.first_perplexity is not None and self.final_perplexity is not None else "n/a")
        state = "interrupted" if self.interrupted else "done"
        return [
            f"pretraining {state}: {self.steps:,} steps in {self.seconds / 60:.1f} min",
            f"  corpus          {self.corpus}",
            f"  parameters      {self.parameters:,}",
            f"  tokens seen     {self.tokens_seen:,}",
            f"  eval perplexity {ppl}",
            f"  outputs         {self.output_dir}/ (model + tokenizer, metrics.jsonl, perplexity.png, tensorboard/)",
        ]


def pretrain(options: PretrainOptions, callbacks: Sequence[TrainerCallback] = ()) -> PretrainSummary:
    """Run (or resume) pretraining; see the module docstring for what lands in `options.output_dir`."""
    started = time.perf_counter()
    recipe = options.recipe
    config = check_options(options)
    seq_len = recipe.seq_len or config.max_position_embeddings
    resume_from = check_output_dir(options)
    args = training_arguments(options, resuming=resume_from is not None)
    with args.main_process_first(desc="preparing data"):
        data = prepare_data(options, seq_len, resume_from)
    model = build_model(recipe, data.tokenizer)

    out = options.output_dir
    if args.process_index == 0:
        if options.overwrite and resume_from is None and out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / OPTIONS_FILE, json.dumps(options.to_json(), indent=2) + "\n")
    metrics = MetricsWriter(out)
    if resume_from is not None and args.process_index == 0:
        metrics.keep_until(int(resume_from.name.removeprefix("checkpoint-")))
    throughput = ThroughputMeter()
    collator = (MaskingCollator(data.tokenizer, recipe.mlm_probability, recipe.seed) if recipe.objective == "mlm"
                else padding_collator(data.tokenizer))
    trainer = PretrainTrainer(
        model=model, args=args, data_collator=collator, train_dataset=data.train, eval_dataset=data.eval,
        processing_class=data.tokenizer, objective=recipe.objective, throughput=throughput,
        callbacks=[throughput, metrics, *callbacks],
    )
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(PretrainProgress())
    if args.process_index == 0:
        from torch.utils.tensorboard import SummaryWriter

        trainer.add_callback(TensorBoardCallback(SummaryWriter(log_dir=str(out / "tensorboard"))))

    interrupted = False
    try:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    except KeyboardInterrupt:
        interrupted = True
    if not interrupted:
        save_final(trainer, out)
    rows = metrics.rows
    return PretrainSummary(
        output_dir=out, parameters=model.num_parameters(), tokens_seen=trainer.state.num_input_tokens_seen,
        steps=trainer.state.global_step, first_perplexity=rows[0]["perplexity"] if rows else None,
        final_perplexity=rows[-1]["perplexity"] if rows else None, seconds=time.perf_counter() - started,
        corpus=data.corpus, interrupted=interrupted,
    )


def save_final(trainer: Trainer, out: Path) -> None:
    """Model, config and tokenizer into `out`, written to a temporary folder then moved in. ELECTRA
    runs also get `discriminator/`: the encoder to fine-tune, loadable with any AutoModel class."""
    tmp = out / ".final.tmp"
    trainer.save_model(str(tmp))  # saves on the main process only, and the tokenizer with it
    if trainer.args.process_index == 0:
        model = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(model, "save_discriminator"):
            model.save_discriminator(tmp / "discriminator")
            trainer.processing_class.save_pretrained(tmp / "discriminator")
        for item in tmp.iterdir():
            target = out / item.name
            if target.is_dir():
                shutil.rmtree(target)
            item.replace(target)
        tmp.rmdir()
        write_model_card(out)
    trainer.accelerator.wait_for_everyone()

