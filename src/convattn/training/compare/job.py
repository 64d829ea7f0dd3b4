"""Running a comparison: the shared tokenizer, then every run and seed trained, resumed or reused (and
fine-tuned on GLUE or SQuAD when asked), then the report."""

from __future__ import annotations

import contextlib
import datetime
import json
import shutil
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from convattn.console import log_to, main_process, say, world_size
from convattn.data.corpus import check_text_flags, load_corpus
from convattn.data.glue import get_task
from convattn.data.squad import load_squad
from convattn.data.tokenizer import load_tokenizer, trained_tokenizer
from convattn.errors import UsageError, option
from convattn.files import staging_dir, write_json_atomic
from convattn.runs.finetune import glue_dir, squad_dir
from convattn.runs.folder import PARTIAL, REPLACED, check_output_folder, check_own_folder, run_folder_lock
from convattn.runs.pretrain import DISCRIMINATOR, FINISHED, IN_PROGRESS, PRETRAIN, read_metrics, run_state
from convattn.runs.replace import recover_replaced_run
from convattn.training.compare.grids import RunSpec, check_runs
from convattn.training.compare.lengths import LengthRequest, write_length_report
from convattn.training.compare.memory import update_memory
from convattn.training.compare.options import (
    CompareOptions,
    check_same_settings,
    run_options,
    run_recipe,
    say_recipe_notes,
    tokenizer_dir,
)
from convattn.training.compare.report import REPORT_RUNS, Report, write_report
from convattn.training.compare.results import read_downstream, seeds_in_output
from convattn.training.execution import check_one_gpu_per_process
from convattn.training.finetune.settings import least_steps_that_train
from convattn.training.glue import check_task_files, run_glue
from convattn.training.pretrain import PretrainOptions, check_options, pretrain, sequence_length
from convattn.training.squad import run_squad

TOKENIZER_RECORD = "compare_tokenizer.json"  # beside the shared tokenizer: what it was trained for
COMPARE_RECORD = "compare.json"  # written first: the folder is a comparison's, which a later compare continues


def check_comparison_folder(options: CompareOptions) -> None:
    """The output folder is new, empty or a comparison's (one written before COMPARE_RECORD existed is known by its
    report or its shared tokenizer): a folder holding anything else is someone else's, and is refused. So is one
    holding the run an interrupted --overwrite kept aside (a comparison never replaces its own folder): that run
    comes back with the command that was replacing it, which a comparison cannot know."""
    out = options.output_dir
    if remains := [name for name in (REPLACED, PARTIAL) if (out / name).exists()]:
        raise UsageError(f"{option('output_dir')} {out} holds {', '.join(f'{name}/' for name in remains)}, the earlier "
                         "run an interrupted `convattn pretrain|glue|squad --overwrite` kept aside there; run that "
                         f"command again to get it back, or choose another {option('output_dir')}")
    check_own_folder(out, (COMPARE_RECORD, REPORT_RUNS, f"tokenizer/{TOKENIZER_RECORD}"))


def recover_seed_folders(options: CompareOptions) -> None:
    """Finish what a killed `pretrain --overwrite` left in a run's seed folder, as pretrain itself would (the
    earlier run back, or gone once the new one stands), before the folder's state decides whether it is reused,
    resumed or trained again: a finished run kept aside is reused, not trained over."""
    for spec in options.grid.runs:
        for path in sorted(options.run_path(spec).glob("seed*")):
            if (path / REPLACED).exists() or (path / PARTIAL).exists():
                with run_folder_lock(path):
                    recover_replaced_run(path, PRETRAIN)


def shared_tokenizer(options: CompareOptions, seq_len: int) -> Path:
    """The tokenizer of every run: --tokenizer, or one trained once on the train text and saved in the output
    (with a record of what it was trained for, checked when the comparison continues)."""
    directory = tokenizer_dir(options)
    if options.data.get("tokenizer"):
        return directory
    data = options.data
    wanted = {"vocab_size": run_recipe(options, options.grid.runs[0], 0).vocab_size,
              **{key: data[key] for key in ("dataset", "dataset_config", "train_files")}}
    wanted = json.loads(json.dumps(wanted, default=str))
    record = directory / TOKENIZER_RECORD
    if record.is_file():
        trained_for = json.loads(record.read_text())
        if trained_for != wanted:
            raise UsageError(f"{directory} was trained for other text or vocabulary ({json.dumps(trained_for)}); "
                             f"use another {option('output_dir')}, or delete that directory")
        return directory
    say("compare", f"training the shared tokenizer (unigram, up to {wanted['vocab_size']:,} pieces) -> {directory}")
    corpus = load_corpus(data["dataset"], data["dataset_config"], data["train_files"], data["eval_files"],
                         data["cache_dir"], data.get("allow_eval_overlap", False))
    tokenizer = trained_tokenizer(corpus.train, corpus.identity, wanted["vocab_size"], seq_len, data["cache_dir"])
    if len(tokenizer) < wanted["vocab_size"]:
        say("compare", f"the shared tokenizer has {len(tokenizer):,} pieces, fewer than the "
                       f"{wanted['vocab_size']:,} asked with --vocab-size (this corpus holds no more); every run's "
                       f"vocabulary is {len(tokenizer):,}")
    tmp = staging_dir(directory)
    try:
        tokenizer.save_pretrained(str(tmp))
        write_json_atomic(tmp / TOKENIZER_RECORD, wanted)
        tmp.replace(directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


@dataclass
class CompareOutcome:
    trained: int  # runs trained (or resumed) by this invocation
    reused: int  # finished runs found and reused
    interrupted: bool = False


def validate(options: CompareOptions) -> int:
    """Check every run's options and existing directories before anything is written; returns the longest
    sequence length (the tokenizer's maximum)."""
    check_runs(options.grid.runs)
    if options.seeds < 1:
        raise UsageError(f"{option('seeds')} {options.seeds} must be at least 1")
    say_recipe_notes(options)
    seq_len = 0
    for spec in options.grid.runs:
        for seed in range(options.seeds):
            pretrain_options = run_options(options, spec, seed)
            config = check_options(pretrain_options)
            check_projection_length(spec, pretrain_options.recipe, config)
            seq_len = max(seq_len, sequence_length(pretrain_options.recipe, config))
            check_same_settings(pretrain_options)
            # what the report reads of a run made earlier, checked now rather than after the others have trained
            read_metrics(pretrain_options.output_dir)
            read_downstream(pretrain_options.output_dir)
    # each file text, and no eval file a training file: said now, not after the first runs
    check_text_flags(options.data["train_files"], options.data["eval_files"],
                     options.data.get("allow_eval_overlap", False))
    check_fine_tuning_steps(options)
    if options.glue:  # read now, not after hours of pretraining
        check_task_files([get_task(name) for name in options.glue.tasks], options.glue.data_dir)
    if options.squad:  # read now (a local file or the hub), not after hours of pretraining
        for split, file in (("train", options.squad.train_file), ("dev", options.squad.dev_file)):
            load_squad(options.squad.version, split, file)
    return seq_len


def check_projection_length(spec: RunSpec, recipe, config) -> None:
    """Linformer's E/F (and Conv-Linformer's stride) are sized to max_position_embeddings: trained on shorter
    inputs, their columns past the input's end never learn and k projected positions summarise fewer tokens than
    the preset says, so the row is not the model it names."""
    seq_len = sequence_length(recipe, config)
    positions = config.max_position_embeddings
    if any(kind != "none" for kind in config.layer_projections) and seq_len != positions:
        raise UsageError(f"run {spec.name}: {option('seq_len')} {seq_len} does not match the {positions} positions "
                         f"its Linformer projections (E/F, k={config.linformer_k}) are sized to "
                         f"(max_position_embeddings); give {option('seq_len')} {positions}, or a preset built for "
                         f"{seq_len} positions")


def check_fine_tuning_process(options: CompareOptions) -> None:
    """Fine-tuning runs in one process (`check_one_process`): a launch of several that asks for --glue or --squad
    is refused now, not after hours of pretraining; its runs pretrain under the launcher without them, and the
    same command run again alone fine-tunes them (finished runs are reused)."""
    asked = [flag for flag, request in (("--glue", options.glue), ("--squad", options.squad)) if request]
    processes = world_size()
    if asked and processes > 1:
        raise UsageError(f"{' and '.join(asked)} fine-tune in one process, and this comparison is one of "
                         f"{processes} that a launcher started (WORLD_SIZE={processes}): pretrain under the launcher "
                         f"without {' and '.join(asked)}, then run the command with them without the launcher (the "
                         "finished runs are reused)")


def check_fine_tuning_steps(options: CompareOptions) -> None:
    """--glue-max-steps / --squad-max-steps train something: under the recipe's warmup a single step runs at
    learning rate 0, and its untrained model would be reported, after hours of pretraining (`check_trains`)."""
    from convattn.training.glue import load_glue_recipe
    from convattn.training.squad.settings import load_squad_recipe

    asked = []
    if options.glue and options.glue.overrides.get("max_steps"):
        recipe = load_glue_recipe(options.glue.recipe)
        warmup = max(recipe.task_fields(task, False)["warmup_ratio"] for task in options.glue.tasks)
        asked.append(("--glue-max-steps", options.glue.overrides["max_steps"], warmup))
    if options.squad and options.squad.overrides.get("max_steps"):
        warmup = load_squad_recipe("convbert").defaults["warmup_ratio"]
        asked.append(("--squad-max-steps", options.squad.overrides["max_steps"], warmup))
    for flag, steps, warmup in asked:
        if steps < (least := least_steps_that_train(warmup)):
            raise UsageError(f"{flag} {steps} trains nothing: the recipe's warmup ({warmup:g} of the steps, rounded up "
                             f"to whole steps) runs it at learning rate 0; give {flag} {least} or more")


def train_one(pretrain_options: PretrainOptions, label: str) -> tuple[bool, int | None]:
    """Train, resume or restart one run (`pretrain_options` says which); returns (interrupted, CUDA peak bytes or
    None)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    summary = pretrain(pretrain_options, label=label)
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    return summary.interrupted, peak


def run_compare(options: CompareOptions, plan: RunPlan) -> CompareOutcome:
    """Train (or reuse) every run and seed of `plan` and fine-tune on GLUE if asked (`write_report` then
    reports)."""
    log_to(options.output_dir)
    outcome = CompareOutcome(trained=0, reused=0)
    total = len(options.grid.runs) * options.seeds
    for index, spec in enumerate(options.grid.runs):
        cuda_peaks = {}
        for seed in range(options.seeds):
            number = index * options.seeds + seed + 1
            path = options.run_path(spec, seed)
            state, exists = plan.states[spec.name, seed]
            if state == FINISHED:
                say("compare", f"[{number}/{total}] {spec.name} seed {seed}: finished earlier, reused")
                outcome.reused += 1
                continue
            resume = state == IN_PROGRESS
            pretrain_options = run_options(options, spec, seed, resume=resume, overwrite=not resume and exists)
            doing = "resuming" if resume else "training"
            say("compare", f"[{number}/{total}] {spec.name} seed {seed}: {doing} -> {path}")
            interrupted, peak = train_one(pretrain_options, f"{spec.name} seed {seed}")
            outcome.trained += 1
            if peak is not None:
                cuda_peaks[seed] = peak
            if interrupted:
                outcome.interrupted = True
                return outcome
        if main_process():
            update_memory(options, spec, plan.tokenizer, cuda_peaks)
        if options.glue or options.squad:
            fine_tune_runs(options, spec)
    return outcome


def fine_tune_runs(options: CompareOptions, spec: RunSpec) -> None:
    execution = {"precision": options.precision, "compile": options.compile}  # as the runs pretrained
    for seed in range(options.seeds):
        path = options.run_path(spec, seed)
        model = path / DISCRIMINATOR if (path / DISCRIMINATOR).is_dir() else path
        if request := options.glue:
            say("compare", f"{spec.name} seed {seed}: GLUE {','.join(request.tasks)}")
            run_glue(str(model), request.tasks, glue_dir(path), data_dir=request.data_dir, recipe=request.recipe,
                     seeds=request.seeds, overrides=execution | request.overrides, save_models="none")
        if request := options.squad:
            say("compare", f"{spec.name} seed {seed}: SQuAD v{request.version}")
            run_squad(str(model), request.version, squad_dir(path), train_file=request.train_file,
                      dev_file=request.dev_file, seeds=request.seeds, overrides=execution | request.overrides,
                      save_models="none")


def compare_and_report(options: CompareOptions, report_only: bool, eval_lengths: LengthRequest | None = None) -> int:
    """Run (or only report) a comparison and print its summary table; returns the exit code (130: interrupted).
    The output folder is this process's while it runs (the lock pretrain takes), and only if it is a comparison's.

    Under a launcher's several processes every run trains over all of them, and the main process alone checks the
    folder, takes its lock, mends what a killed run left and trains the shared tokenizer before the others read any
    of it (they wait at a barrier, which a main process that refuses never reaches: the launcher ends them); each
    process then reads which runs are finished, in progress or new before any writes a run (a second barrier), and
    the main process alone writes the report."""
    if not report_only:  # every process checks these before they join, and refuses alike
        check_one_gpu_per_process("compare")
        check_fine_tuning_process(options)
    processes = launched_processes()
    with ExitStack() as held:
        with main_process_first(processes):
            check_output_folder(options.output_dir)  # before the lock creates it
            held.enter_context(run_folder_lock(options.output_dir))
            check_comparison_folder(options)
            recover_seed_folders(options)
            plan = None if report_only else planned_runs(options)
        if processes is not None:
            processes.wait_for_everyone()
        return compare_in_folder(options, plan, eval_lengths)


def launched_processes():
    """accelerate's state of the processes a launcher started (made as each run's TrainingArguments makes it: they
    rebuild the state over the process group made here), or None for a process that runs alone."""
    if world_size() == 1:
        return None
    from accelerate import PartialState
    from transformers import TrainingArguments

    timeout = datetime.timedelta(seconds=TrainingArguments.__dataclass_fields__["ddp_timeout"].default)
    return PartialState(cpu=not torch.cuda.is_available(), timeout=timeout)


def main_process_first(processes):
    """The main process runs the block first, the others after it (a barrier between); alone, just the block."""
    return contextlib.nullcontext() if processes is None else processes.main_process_first()


@dataclass
class RunPlan:
    """What a comparison trains: every run and seed's folder state (runs/pretrain.py's run_state) and whether its
    folder exists, read before any process writes a run, so that every process trains the same runs."""

    tokenizer: Any
    states: dict[tuple[str, int], tuple[str, bool]]


def planned_runs(options: CompareOptions) -> RunPlan:
    """Check every run (`validate`), make or read the shared tokenizer, mark the folder a comparison's, and read
    each run's state."""
    seq_len = validate(options)
    tokenizer = load_tokenizer(shared_tokenizer(options, seq_len))  # reads the corpus: a failure writes nothing
    if main_process() and not (options.output_dir / COMPARE_RECORD).is_file():
        write_json_atomic(options.output_dir / COMPARE_RECORD, {"written_by": "convattn compare"})
    states = {(spec.name, seed): (run_state(path), path.exists())
              for spec in options.grid.runs for seed in range(options.seeds)
              for path in [options.run_path(spec, seed)]}
    return RunPlan(tokenizer, states)


def compare_in_folder(options: CompareOptions, plan: RunPlan | None, eval_lengths: LengthRequest | None) -> int:
    """Train the runs `plan` holds (None: only report on those the folder holds), then, in the main process, write
    and print the report."""
    interrupted = False
    if plan is None:
        check_runs(options.grid.runs)
        options.seeds = seeds_in_output(options)
        if not options.seeds:
            raise UsageError(f"{option('report_only')}: {options.output_dir} has no runs of these models to report "
                             f"on; check {option('output_dir')} and {option('grid')}/{option('presets')}")
    else:
        outcome = run_compare(options, plan)
        interrupted = outcome.interrupted
        if main_process():
            print(f"compare: {outcome.trained} run(s) trained, {outcome.reused} reused", file=sys.stderr)
    if main_process():
        results, folder = write_report(options)
        print("\n".join(Report(options, results, figure=None).summary_lines()))
        if eval_lengths:
            print("\n".join(write_length_report(options, eval_lengths)))
        print(f"report: {folder / 'report.md'} (also report.html, perplexity.png, metrics.csv, summary.csv)")
    if interrupted:
        if main_process():
            print("interrupted: run the same command again to continue (finished runs are reused)", file=sys.stderr)
        return 130
    return 0
