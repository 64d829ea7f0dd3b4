"""The pretraining job: one run, start to finish (or resumed), and its printed summary."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from transformers import ProgressCallback, Trainer, TrainerCallback, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback
from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

from convattn.config import ConvAttnConfig
from convattn.console import log_to, main_process, processes, say, say_launch, world_size
from convattn.errors import UsageError, option
from convattn.files import write_json_atomic
from convattn.hub import write_model_card
from convattn.openmp import compute_clock_warning, threads_sleep
from convattn.runs.checkpoints import check_checkpoint_fits, is_whole
from convattn.runs.environment import (
    ENVIRONMENT_FILE,
    changes,
    code_change,
    environment,
    record_environment,
    recorded_environments,
)
from convattn.runs.folder import check_output_folder, run_folder_lock
from convattn.runs.pretrain import (
    DATA_FILE,
    DISCRIMINATOR,
    FINAL_MODEL,
    FINAL_TMP,
    METRICS_FILE,
    OPTIONS_FILE,
    PLOT_FILE,
    PRETRAIN,
    TENSORBOARD,
    TRAINER_STATE,
    check_same_data,
    checkpoint_step,
    checkpoints_dir,
    complete_checkpoints,
    read_metrics,
    remove_run_files,
)
from convattn.runs.replace import (
    discard_unless_standing,
    drop_replaced,
    drop_replaced_if_standing,
    move_aside,
    recover_replaced_run,
    restore_replaced,
)
from convattn.training.execution import check_one_gpu_per_process, run_precision
from convattn.training.guards import TrainedSteps
from convattn.training.pretrain.budget import (
    CLOCK_EXPLAINED,
    CLOCK_WORDS,
    EVALUATIONS,
    StepMeter,
    TrainingClock,
    format_duration,
    time_spent,
)
from convattn.training.pretrain.callbacks import (
    MetricsWriter,
    PretrainProgress,
    ThroughputMeter,
    elapsed_at,
    steps_trained,
)
from convattn.training.pretrain.data import MaskingCollator, padding_collator, prepare_data
from convattn.training.pretrain.options import (
    OutputPlan,
    PretrainOptions,
    check_options,
    check_output_dir,
    sequence_length,
)
from convattn.training.pretrain.trainer import PretrainTrainer, build_model, pretraining_arguments
from convattn.training.pretrain.warm_up import warm_up, warms_kernel
from convattn.training.recipes import warmup_steps

# the share of a run's steps slowed by other processes from which the summary says how to wait on a busy CPU
BUSY_RUN = 0.5


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
    already_finished: bool = False
    budget: float | None = None  # a time-budget run: its budget, its clock and the training time spent, in seconds
    clock: str | None = None
    spent: float = 0.0
    wall_spent: float = 0.0
    slowed: float | None = None  # the share of this session's steps that other processes slowed (None: not known)
    checkpoint: Path | None = None  # the last complete checkpoint of an interrupted run
    eval_overlap: str | None = None  # eval text that is training text (--allow-eval-overlap): said with the score

    def lines(self) -> list[str]:
        if self.already_finished:
            return [f"pretraining already finished: {self.steps:,} steps; nothing to do",
                    f"  outputs         {self.output_dir}/ (model + tokenizer, {METRICS_FILE}, {PLOT_FILE})"]
        ppl = (f"{self.first_perplexity:,.1f} -> {self.final_perplexity:,.1f}"
               if self.first_perplexity is not None and self.final_perplexity is not None else "n/a")
        state = "interrupted" if self.interrupted else "done"
        lines = [
            f"pretraining {state}: {self.steps:,} steps in {self.seconds / 60:.1f} min",
            f"  corpus          {self.corpus}",
            f"  parameters      {self.parameters:,}",
            f"  tokens seen     {self.tokens_seen:,}",
            f"  eval perplexity {ppl}" + (f" ({self.eval_overlap})" if self.eval_overlap else ""),
        ]
        if self.budget is not None:
            ended = "reached" if self.spent >= self.budget else f"{self.spent / self.budget:.0%} spent"
            lines.append(f"  time budget     {format_duration(self.budget)} of training ({CLOCK_WORDS[self.clock]}), "
                         f"{ended}" + (f"; {format_duration(self.wall_spent)} of steps on the wall clock"
                                       if self.clock != "wall" else ""))
        if self.slowed:
            lines.append(f"  outside load    {self.slowed:.0%} of the steps waited for a CPU that other processes held"
                         + ("; the budget's compute clock does not count that" if self.clock == "compute" else ""))
            if self.slowed >= BUSY_RUN and not threads_sleep():
                lines.append(" " * 18 + "(on a busy CPU, OMP_WAIT_POLICY=PASSIVE trains faster: idle threads then "
                             "sleep at once instead of spinning; RESULTS 5)")
        if not self.interrupted:
            return [*lines, f"  outputs         {self.output_dir}/ (model + tokenizer, {METRICS_FILE}, {PLOT_FILE}, "
                            f"{TENSORBOARD}/)"]
        if self.checkpoint is None:
            return [*lines, "  nothing saved   (stopped before the first checkpoint); run the same command again to "
                            "start over"]
        return [*lines, f"  last checkpoint {self.checkpoint} (continue with: convattn pretrain --output-dir "
                        f"{self.output_dir} --resume)"]


def pretrain(options: PretrainOptions, callbacks: Sequence[TrainerCallback] = (),
             label: str | None = None) -> PretrainSummary:
    """Run (or resume) pretraining; see the package docstring for what lands in `options.output_dir`. `label`
    names the run in its per-evaluation lines (a comparison runs several)."""
    config = check_options(options)
    check_one_gpu_per_process("pretrain")
    args = pretraining_arguments(options)  # joins the other processes of a multi-process run
    with ExitStack() as run:
        # the main process checks the output folder, takes its lock and mends what a killed run left before the
        # others read it (a rank reading it while rank 0 made and removed its probe folder failed); one that raises
        # never reaches the barrier, so the others read nothing until the launcher ends them (transformers'
        # main_process_first would let them in, over a folder rank 0 is removing). The main process writes there
        # next after the data's barrier (train_run), which the others reach after their checks.
        with args.distributed_state.main_process_first():
            check_output_folder(options.output_dir)  # before the lock creates it
            run.enter_context(run_folder_lock(options.output_dir))
            if main_process():
                recover_replaced_run(options.output_dir, PRETRAIN)
            plan = check_output_dir(options)
        args.eval_on_start = plan.resume_from is None  # a resumed run evaluated its start
        final = options.output_dir / FINAL_MODEL
        if plan.schedule_ended and final.is_file():
            if is_whole(final):
                return finished_summary(options)
            say("pretrain", f"{final} is truncated or corrupt: saving the final model again from {plan.resume_from}")
        return train_run(options, config, plan, args, callbacks, label)


def train_run(options: PretrainOptions, config: ConvAttnConfig, plan: OutputPlan, args: TrainingArguments,
              callbacks: Sequence[TrainerCallback], label: str | None = None) -> PretrainSummary:
    started = time.perf_counter()
    recipe, out = options.recipe, options.output_dir
    seq_len = sequence_length(recipe, config)
    spent = time_spent(plan.resume_from) if plan.resume_from else {}
    clock = TrainingClock(recipe.time_budget, recipe.budget_clock, spent) if recipe.time_budget is not None else None
    if clock is not None and clock.reads_compute and (note := compute_clock_warning(args.device.type)):
        say("pretrain", f"warning: {note}")
    meter = clock or StepMeter(spent.get("wall", 0.0), spent.get("compute", 0.0))
    say("pretrain", f"{schedule_line(recipe, clock)}; {processes()}")
    say_launch("pretrain")
    with args.main_process_first(desc="preparing data"):
        data = prepare_data(options, seq_len, plan.resume_from)
    if plan.resume_from is not None:
        check_same_data(out, data.corpus, data.fingerprint, data.tokenizer_fingerprint,
                        options.tokenizer or f"the one saved in {plan.resume_from}")
    model = build_model(recipe, config, data.tokenizer)
    if plan.resume_from is not None:
        check_checkpoint_fits(complete_checkpoints(checkpoints_dir(out)), model)
    # the tokenizer states the length the model takes: any length for relative positions (no overflow warnings)
    data.tokenizer.model_max_length = model.config.max_input_length or VERY_LARGE_INTEGER

    # everything is checked and ready: only now does the old run (if any) make way
    if args.process_index == 0:
        if plan.replace:
            say("pretrain", f"replacing the run in {out} (kept aside until the new one saves its first checkpoint)")
            move_aside(out, PRETRAIN)
        write_json_atomic(out / OPTIONS_FILE, options.to_json())
        if plan.resume_from is None:
            write_json_atomic(out / DATA_FILE, {"corpus": data.corpus, "fingerprint": data.fingerprint,
                                                 "tokenizer": data.tokenizer_fingerprint,
                                                 "vocab_size": len(data.tokenizer),
                                                 **({"eval_overlap": data.eval_overlap} if data.eval_overlap
                                                    else {})})
        log_to(out)
        note_environment(out, args, plan)
    metrics = MetricsWriter(out, meter)
    if plan.resume_from is not None and args.process_index == 0:
        metrics.keep_until(checkpoint_step(plan.resume_from), elapsed_at(plan.resume_from))
    throughput = ThroughputMeter()
    trained = TrainedSteps(steps_trained(plan.resume_from) if plan.resume_from else 0)
    collator = (MaskingCollator(data.tokenizer, recipe.mlm_probability, recipe.seed) if recipe.objective == "mlm"
                else padding_collator(data.tokenizer))
    trainer = PretrainTrainer(
        model=model, args=args, data_collator=collator, train_dataset=data.train, eval_dataset=data.eval,
        processing_class=data.tokenizer, objective=recipe.objective, throughput=throughput, clock=clock,
        eval_collator=dataclasses.replace(collator, per_example=True) if recipe.objective == "mlm" else None,
        warmup=recipe.warmup, callbacks=[throughput, trained, meter, metrics,
                                         DropReplacedRun(out, trained), *callbacks],
    )
    trainer.divergence_hint = (f"start again with a lower --lr (now {recipe.learning_rate:g}) or --overwrite the run "
                               "with other settings")
    trainer.remove_callback(ProgressCallback)
    progress = PretrainProgress(clock, label)
    trainer.add_callback(progress)
    if args.process_index == 0:
        from torch.utils.tensorboard import SummaryWriter

        trainer.add_callback(TensorBoardCallback(SummaryWriter(log_dir=str(out / TENSORBOARD))))

    if args.dataloader_num_workers:
        # the tokenizers are done (the data is formatted): their threads need not warn at each worker's fork
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if warms_kernel(args, trainer.model) and not plan.schedule_ended:
        seconds = warm_up(trainer, seq_len)
        say("pretrain", f"warm-up before the clock: the batch shapes the fused kernel compiles apart, {seconds:.1f} s")

    interrupted = False
    try:
        if plan.schedule_ended:  # the last checkpoint is the end of the schedule: only the final save is missing
            trainer._load_from_checkpoint(str(plan.resume_from))
            trainer.state = TrainerState.load_from_json(str(plan.resume_from / TRAINER_STATE))
        else:
            trainer.train(resume_from_checkpoint=str(plan.resume_from) if plan.resume_from else None)
    except BaseException as stop:  # Ctrl-C / SIGTERM ends the run with a summary; anything else is raised on
        progress.close()
        if args.process_index == 0:
            discard_unless_standing(out, PRETRAIN)
        if not isinstance(stop, KeyboardInterrupt):
            raise
        interrupted = True
    if not interrupted:
        if trained.steps == 0:
            untrained_run(options, plan, trainer.state.global_step)
        save_final(trainer, out)
    checkpoints = complete_checkpoints(checkpoints_dir(out))
    rows = metrics.rows
    return PretrainSummary(
        output_dir=out, parameters=model.num_parameters(), tokens_seen=trainer.state.num_input_tokens_seen,
        steps=trainer.state.global_step, first_perplexity=rows[0]["perplexity"] if rows else None,
        final_perplexity=rows[-1]["perplexity"] if rows else None, seconds=time.perf_counter() - started,
        corpus=data.corpus, interrupted=interrupted, checkpoint=checkpoints[-1] if checkpoints else None,
        budget=recipe.time_budget, clock=clock.clock if clock else None, spent=clock.spent if clock else 0.0,
        wall_spent=meter.wall_spent, slowed=meter.steps_slowed / meter.steps_seen if meter.steps_seen else None,
        eval_overlap=data.eval_overlap,
    )


def note_environment(out: Path, args, plan: OutputPlan) -> None:
    """Append the environment this start trains in to the run's environment.jsonl, and say on a resume what moved
    since the last start: its times are not comparable across that line, nor its numbers where the code moved."""
    entry = environment(args.device, world_size(), run_precision({"bf16": args.bf16, "fp16": args.fp16}))
    earlier = recorded_environments(out) if plan.resume_from is not None else []
    if earlier and (moved := changes(earlier[-1], entry)):
        say("pretrain", f"resuming with other settings than the start at step {earlier[-1].get('step', 0):,}: "
                        f"{'; '.join(moved)} ({ENVIRONMENT_FILE} keeps each start's; times and tokens/s before "
                        "and after differ by them too)")
    if earlier and (code := code_change(earlier[-1], entry)):
        say("pretrain", f"resuming with other code than the start at step {earlier[-1].get('step', 0):,}: {code} "
                        f"(convattn's files changed; {ENVIRONMENT_FILE} keeps each start's: the steps from here, "
                        "and the numbers after them, are computed by the new code)")
    record_environment(out, checkpoint_step(plan.resume_from) if plan.resume_from else 0, entry)


def schedule_line(recipe, clock: TrainingClock | None) -> str:
    """The learning-rate schedule in one line: over steps, or over a time budget (with the steps cap, if any)."""
    if clock is None:
        return (f"schedule: {recipe.max_steps:,} steps of {recipe.batch_size} examples, linear warmup over "
                f"{warmup_steps(recipe):,} steps to lr {recipe.learning_rate:g}, then linear decay")
    line = (f"schedule: {format_duration(clock.budget)} of training {CLOCK_WORDS[clock.clock]} "
            f"({CLOCK_EXPLAINED[clock.clock]}; evaluation and checkpoints not counted) in "
            f"steps of {recipe.batch_size} examples, linear warmup over the first {recipe.warmup:.0%} to lr "
            f"{recipe.learning_rate:g}, then linear decay to 0 at the deadline; an evaluation and a checkpoint "
            f"every {format_duration(clock.budget / EVALUATIONS)}")
    if clock.spent:
        line += f"; {format_duration(clock.spent)} already spent"
    if recipe.max_steps is not None:
        line += f"; stops at step {recipe.max_steps:,} if that comes first"
    return line


class DropReplacedRun(TrainerCallback):
    """The old run an --overwrite kept aside goes once the new run has saved its first checkpoint of a model that
    trained (a step above learning rate 0)."""

    def __init__(self, out: Path, trained: TrainedSteps):
        self.out, self.trained = out, trained

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.trained.steps != 0:
            drop_replaced_if_standing(self.out, PRETRAIN)


def untrained_run(options: PretrainOptions, plan: OutputPlan, steps: int) -> None:
    """A run whose every step was at learning rate 0 (all warmup: a time budget spent by its first step) saved
    the untrained model: it is no result. A new run's files go (and the run it replaced comes back); a resumed
    run's stay as they are. `check_options` refuses such a step schedule before anything is written: this is the
    guard."""
    if main_process() and plan.resume_from is None:
        remove_run_files(options.output_dir)
        restore_replaced(options.output_dir, PRETRAIN)
    warmup = (f"{options.recipe.warmup:.0%} of the budget" if options.recipe.time_budget
              else f"{warmup_steps(options.recipe):,} step(s)")
    raise UsageError(f"pretraining took {steps:,} step(s), none at a learning rate above 0 (all in the warmup, "
                     f"{warmup}): the model is untrained, so no model is saved; give a longer "
                     f"{option('time_budget') if options.recipe.time_budget else option('max_steps')} or a shorter "
                     f"{option('warmup')}")


def finished_summary(options: PretrainOptions) -> PretrainSummary:
    """--resume of a run that already reached --max-steps: nothing is touched."""
    out = options.output_dir
    rows = read_metrics(out)
    steps = checkpoint_step(complete_checkpoints(checkpoints_dir(out))[-1])
    return PretrainSummary(
        output_dir=out, parameters=0, tokens_seen=rows[-1].get("tokens_seen", 0) if rows else 0, steps=steps,
        first_perplexity=rows[0]["perplexity"] if rows else None,
        final_perplexity=rows[-1]["perplexity"] if rows else None, seconds=0.0, corpus="", already_finished=True,
    )


def save_final(trainer: Trainer, out: Path) -> None:
    """Model, config and tokenizer into `out`, written to a temporary folder then moved in. ELECTRA
    runs also get `discriminator/`: the encoder to fine-tune, loadable with any AutoModel class."""
    tmp = out / FINAL_TMP
    trainer.save_model(str(tmp))  # saves on the main process only, and the tokenizer with it
    if trainer.args.process_index == 0:
        model = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(model, "save_discriminator"):
            model.save_discriminator(tmp / DISCRIMINATOR)
            trainer.processing_class.save_pretrained(tmp / DISCRIMINATOR)
        for item in tmp.iterdir():
            target = out / item.name
            if target.is_dir():
                shutil.rmtree(target)
            item.replace(target)
        tmp.rmdir()
        write_model_card(out)
        drop_replaced(out)
    trainer.accelerator.wait_for_everyone()
