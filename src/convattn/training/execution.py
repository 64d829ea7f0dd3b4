"""How a training run executes, for pretraining and fine-tuning alike: the precision the Trainer computes in, and
torch.compile's mode. torch is imported where it is needed (the command line reads the names here)."""

from __future__ import annotations

import os

from convattn.errors import UsageError, option

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# torch.compile's modes (`--compile-mode`). default: inductor's kernels, launched by the host as eager ones are;
# reduce-overhead: the same kernels recorded once per input shape as CUDA graphs and replayed, the host out of the
# step (CUDA only; elsewhere it is default); max-autotune: also times inductor's matmul and kernel choices (minutes
# more to compile), replayed as CUDA graphs
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
# Fine-tuning pads a batch to a multiple of this under torch.compile: a task's batches then have a few shapes, each
# compiled (and recorded as a CUDA graph) once, not one per batch's longest example
COMPILED_PAD_MULTIPLE = 64


def resolved_precision(precision: str) -> str:
    """"auto" as this machine runs it: bf16 on a GPU that has it, else fp16 on a GPU, fp32 on CPU; fp16 without a
    GPU is refused (CPU autocast has bf16, not fp16 with loss scaling)."""
    import torch

    if precision not in PRECISIONS:
        raise UsageError(f"{option('precision')} {precision!r} is not known; choose one of {', '.join(PRECISIONS)}")
    gpu = torch.cuda.is_available()
    if precision == "auto":
        return ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if gpu else "fp32"
    if precision == "fp16" and not gpu:
        raise UsageError(f"{option('precision')} fp16 needs a GPU here; use {option('precision')} bf16 or fp32 (or "
                         "auto) on CPU")
    return precision


def precision_flags(precision: str) -> dict:
    """TrainingArguments' bf16 and fp16 flags for `precision` (auto resolved here)."""
    precision = resolved_precision(precision)
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


def check_one_gpu_per_process(command: str) -> None:
    """A process drives at most one GPU. Given several, the Trainer would wrap the model in torch's DataParallel
    (threads, each GPU a slice of every batch) and batch --batch-size per GPU: a batch that many times the
    recipe's, and a path (the fused kernel, CUDA graphs) convattn does not run. Refused before anything is written,
    with one GPU or one process per GPU as the fix."""
    import torch

    from convattn.console import world_size

    if world_size() > 1 or not torch.cuda.is_available() or (count := torch.cuda.device_count()) < 2:
        return
    several = (f"one process per GPU (torchrun --nproc-per-node {count} -m convattn {command} ...) or "
               if command in ("pretrain", "compare") else "")
    raise UsageError(f"this process sees {count} GPUs, which the Trainer would drive as torch's DataParallel (a "
                     f"batch of {option('batch_size')} per GPU, {count}x the one asked); convattn {command} runs "
                     f"{several}one GPU a process: give CUDA_VISIBLE_DEVICES=0 (or another GPU's number)")


def stays_on_cpu(bf16: bool, processes: int = 1) -> bool:
    """TrainingArguments' use_cpu: without a GPU, bf16 autocast (the Trainer allows it on the CPU only when told to
    stay there) and several processes (CPU data parallel over gloo: accelerate decides only when told)."""
    import torch

    return not torch.cuda.is_available() and (bf16 or processes > 1)


# accelerate launch hands its configuration to the processes it starts as environment variables, which the
# Trainer's TrainingArguments and Accelerator read: FSDP (ACCELERATE_USE_FSDP and its FSDP_* settings) and the
# mixed precision (ACCELERATE_MIXED_PRECISION, "no" for fp32), used where convattn's own flags say nothing
LAUNCHER_FSDP, LAUNCHER_PRECISION, LAUNCHER_FSDP_SETTINGS = "ACCELERATE_USE_FSDP", "ACCELERATE_MIXED_PRECISION", "FSDP_"


def run_precision(flags: dict) -> str:
    """The precision TrainingArguments' bf16 and fp16 flags (`precision_flags`) compute in."""
    return "bf16" if flags["bf16"] else "fp16" if flags["fp16"] else "fp32"


def settle_launcher(flags: dict, processes: int = 1) -> str | None:
    """Make what accelerate's launcher asked for (its environment) agree with what this run does, before the
    TrainingArguments read it, and return one line naming each launcher setting dropped (None: none is).

    Without a GPU, FSDP cannot apply (accelerate shards only over GPUs): the Trainer ran plain data parallelism with
    it, so it is removed and said. The run's precision is convattn's (`--precision`, `flags`): a launcher's
    mixed_precision that differs is set to it, since the Trainer would otherwise compute in the launcher's (bf16
    autocast on CPU) while the run records fp32."""
    import torch

    env, dropped = os.environ, []
    precision = run_precision(flags)
    gpu = torch.cuda.is_available()
    fsdp = env.get(LAUNCHER_FSDP, "false").lower() == "true"
    if fsdp and not gpu:
        version = env.get("FSDP_VERSION")
        others = sum(name.startswith(LAUNCHER_FSDP_SETTINGS) for name in env) - ("FSDP_VERSION" in env)
        detail = ", ".join(([f"fsdp_version {version}"] if version else [])
                           + ([f"{others} more FSDP_* settings"] if others else []))
        dropped.append(f"FSDP ({detail})" if detail else "FSDP")
        del env[LAUNCHER_FSDP]
    launcher = env.get(LAUNCHER_PRECISION)
    if launcher is not None and launcher != ("no" if precision == "fp32" else precision):
        if launcher != "no":
            dropped.append(f"mixed_precision {launcher}")
        env[LAUNCHER_PRECISION] = "no" if precision == "fp32" else precision
    if not dropped:
        return None
    names = " and ".join(dropped)
    if fsdp and not gpu:
        runs = f"plain data parallelism over {processes} processes" if processes > 1 else "one process"
        hint = " (--precision bf16 computes in bf16 on CPU)" if precision == "fp32" else ""
        return (f"accelerate's {names} {'do' if len(dropped) > 1 else 'does'} not apply without GPUs: this run is "
                f"{runs} in {precision}{hint}")
    hint = f" (give --precision {launcher} for the launcher's)" if launcher in PRECISIONS else ""
    return f"accelerate's {names} is not used: this run computes in {precision}, as --precision says{hint}"


def checked_compile_mode(mode: str | None) -> str | None:
    """`mode` if it is one of COMPILE_MODES or None (eager); else one error naming the choices."""
    if mode is not None and mode not in COMPILE_MODES:
        raise UsageError(f"{option('compile_mode')} {mode!r} is not known; choose one of {', '.join(COMPILE_MODES)}")
    return mode


def compile_mode(compile: bool, mode: str | None) -> str | None:
    """The mode `--compile` and `--compile-mode` ask for (the latter implies the former); None: eager."""
    return checked_compile_mode(mode) or ("default" if compile else None)


def recorded_compile_mode(value) -> str | None:
    """A run record's compile field: a mode, or the true / false that runs recorded before modes existed."""
    if isinstance(value, bool):
        return "default" if value else None
    return checked_compile_mode(value)


def compile_arguments(mode: str | None, command: str | None = None) -> dict:
    """TrainingArguments' torch.compile fields for `mode` (None: eager); compiling, random operators as
    `compiled_on_this_device` sets them, and `command` (if given) says what the mode changes on this machine."""
    if mode is not None:
        compiled_on_this_device(mode, command)
    return {"torch_compile": mode is not None, "torch_compile_mode": None if mode in (None, "default") else mode}


# what compiling on this machine changes, said once a process (fine-tuning builds its arguments once a seed)
_SAID: set[str] = set()


def compile_difference(mode: str | None) -> str | None:
    """What a run compiled in `mode` computes differently from an eager run with the same seed, on this machine (None:
    eager). Recorded with the run and said when it starts."""
    import torch

    if mode is None:
        return None
    if torch.cuda.is_available():
        return ("compiled on a GPU: dropout draws its masks from inductor's own random generator, so the losses differ "
                "from an eager run's with the same seed (the same from one compiled run to the next); without dropout "
                "the same numbers, up to rounding")
    return ("compiled: dropout draws its masks from eager PyTorch's generator, as an eager run does, but a training "
            "batch under 90% real tokens runs padding-free in eager mode and padded when compiled, so its dropout "
            "masks, and the losses, differ from an eager run's with the same seed; without dropout, or without such "
            "batches (--format packed), the same numbers, up to rounding")


def compiled_on_this_device(mode: str, command: str | None) -> None:
    """Without a GPU, inductor's random operators fall back to eager ones (`fallback_random`): dropout draws its
    masks from the same generator, in the same order, as an eager run, so a batch computed the same way both ways
    gets the same masks (inductor's own generator gave other masks everywhere: 5.706 for 5.693 at step 2); and
    reduce-overhead, whose CUDA graphs need a GPU, runs as default (torch's own rule). `command` says what still
    differs (`compile_difference`) and what a mode does not do here, once a process."""
    import torch

    def once(line: str) -> None:
        from convattn.console import say

        if command is not None and line not in _SAID:
            _SAID.add(line)
            say(command, line)

    if not torch.cuda.is_available():
        import torch._inductor.config

        torch._inductor.config.fallback_random = True
    once(f"--compile: {compile_difference(mode)}")
    if mode == "reduce-overhead" and not torch.cuda.is_available():
        once("--compile-mode reduce-overhead replays CUDA graphs, and this machine has no GPU: it runs as default "
             "(the same kernels; on CPU compiling takes a minute or more before the first step, and pays back only "
             "over a long run)")
