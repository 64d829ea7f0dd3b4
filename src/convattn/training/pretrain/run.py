"""One pretraining run, start to finish (or resumed), and its printed summary."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import ProgressCallback, Trainer, TrainerCallback
from transformers.integrations import TensorBoardCallback

from convattn.hub import write_model_card
from convattn.training.console import log_to
from convattn.training.pretrain.callbacks import MetricsWriter, PretrainProgress, ThroughputMeter
from convattn.training.pretrain.data import MaskingCollator, padding_collator, prepare_data
from convattn.training.pretrain.options import OPTIONS_FILE, PretrainOptions, check_options, check_output_dir
from convattn.training.pretrain.trainer import PretrainTrainer, build_model, training_arguments
from convattn.training.recipes import warmup_steps
from convattn.training.run_folder import say, write_text_atomic


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
    say("pretrain", f"schedule: {recipe.max_steps:,} steps of {recipe.batch_size} examples, linear warmup over "
                    f"{warmup_steps(recipe):,} steps to lr {recipe.learning_rate:g}, then linear decay")
    with args.main_process_first(desc="preparing data"):
        data = prepare_data(options, seq_len, resume_from)
    model = build_model(recipe, data.tokenizer)

    out = options.output_dir
    if args.process_index == 0:
        if options.overwrite and resume_from is None and out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / OPTIONS_FILE, json.dumps(options.to_json(), indent=2) + "\n")
        log_to(out)
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
