"""How a training run executes, for pretraining and fine-tuning alike: the precision the Trainer computes in, and
torch.compile's mode. torch is imported where it is needed (the command line reads the names here)."""

from __future__ import annotations

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


def stays_on_cpu(bf16: bool, processes: int = 1) -> bool:
    """TrainingArguments' use_cpu: without a GPU, bf16 autocast (the Trainer allows it on the CPU only when told to
    stay there) and several processes (CPU data parallel over gloo: accelerate decides only when told)."""
    import torch

    return not torch.cuda.is_available() and (bf16 or processes > 1)


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


def compile_arguments(mode: str | None) -> dict:
    """TrainingArguments' torch.compile fields for `mode` (None: eager)."""
    return {"torch_compile": mode is not None, "torch_compile_mode": None if mode in (None, "default") else mode}
