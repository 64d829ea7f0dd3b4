"""What a run trained on, recorded each time it starts or resumes: a line of environment.jsonl in its folder.

A time or a throughput is a property of the machine and its settings as much as of the model: the device, the
threads torch uses, how OpenMP's idle threads wait (RESULTS 5: 1.2-1.4x between sleeping and spinning on the same
2 cores), the library versions, and how busy the machine was. A run resumed in another session may have trained
its later steps under other settings, so every start appends one line (the step it starts from, when, and all of
the above), and a resume says in one line what changed since the line before. The model card lists them.

The code is recorded too, by content: convattn's version string does not move when a computation changes, so each
line carries a digest of the package's own files (`source_digest`), and a resume, a comparison and a fine-tuning
job's results say where the code that made their numbers differed.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
from pathlib import Path

from convattn.files import append_text

ENVIRONMENT_FILE = "environment.jsonl"
# the variables that set how many threads run and how idle ones wait (libgomp, Intel's and LLVM's OpenMP, MKL)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "MKL_NUM_THREADS")
# what a resume compares with the line before: what moves a time or a throughput (not the date, step or load)
SETTINGS = ("device", "device_name", "threads", "processes", "precision", "thread_variables", "denormals", "torch",
            "transformers", "convattn")
SOURCE = "convattn_source"  # the key of the code's digest in a record (environment lines, fine-tuning runs)
SOURCE_SUFFIXES = (".py", ".yaml", ".json")  # the code, the presets and the recipes: what decides a number
PACKAGE = Path(__file__).resolve().parents[1]


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), or what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device, processes: int, precision: str) -> dict:
    """This process's environment as a run records it (`device`: the torch.device it trains on)."""
    import torch
    import transformers

    from convattn.denormals import denormals_flushed

    cuda = device.type == "cuda"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if cuda else cpu_name(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": torch.get_num_threads(),
        "processes": processes,
        "precision": precision,
        "thread_variables": {name: os.environ[name] for name in THREAD_VARIABLES if name in os.environ},
        "denormals": "flushed" if denormals_flushed() else "kept",  # x86's cost of them (convattn.denormals)
        "load_average": round(load, 2) if load is not None else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "convattn": _installed_version("convattn"),
        SOURCE: source_digest(),
    }


@functools.cache
def source_digest() -> str:
    """The digest of convattn's code when this process first asks (`files_digest` of the package's folder): two
    records with the same digest were made by the same code, whatever its version string says (an editable
    install's edits included)."""
    return files_digest(PACKAGE)


def files_digest(folder: Path) -> str:
    """12 hex digits of a SHA-256 over the paths and bytes of the code, preset and recipe files under `folder`."""
    digest = hashlib.sha256()
    files = sorted(path for path in folder.rglob("*")
                   if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts and path.is_file())
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def code_change(before: dict, now: dict) -> str | None:
    """'convattn code 1a2b... -> 3c4d...' where two records' code differs; None where it does not or where either
    predates the record."""
    old, new = before.get(SOURCE), now.get(SOURCE)
    return f"convattn code {old} -> {new}" if old and new and old != new else None


def _installed_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "not installed"


def mixed_code_warning(runs: list[tuple[str, dict]]) -> str | None:
    """The warning for results that put together runs (`runs`: a label and its record) made by different convattn
    code, else None; a record from before the digest counts as code of its own."""
    groups: dict[str, list[str]] = {}
    for label, record in runs:
        groups.setdefault(record.get(SOURCE) or "not recorded", []).append(label)
    if len(groups) < 2:
        return None
    listed = "; ".join(f"code {code}: {', '.join(labels)}" for code, labels in groups.items())
    return (f"these results put together runs of different convattn code ({listed}); they compare only where the "
            "change computed nothing they report: fine-tune again with --overwrite for results of one code")


def record_environment(folder: Path, step: int, record: dict) -> None:
    """Append the environment a run starts (step 0) or resumes (its checkpoint's step) with."""
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    path = folder / ENVIRONMENT_FILE
    # a line a kill cut short keeps no newline: the new one starts on a line of its own
    cut = path.is_file() and path.stat().st_size > 0 and not _ends_with_newline(path)
    append_text(path, ("\n" if cut else "") + json.dumps({"step": step, "started": started, **record}) + "\n")


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def recorded_environments(folder: Path) -> list[dict]:
    """The run's environment lines, in order; a damaged line (a kill while appending) is skipped."""
    path = folder / ENVIRONMENT_FILE
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            lines.append(entry)
    return lines


def changes(before: dict, now: dict) -> list[str]:
    """What differs in the settings that move a time or a throughput: 'threads 2 -> 4', ..."""
    said = []
    for key in SETTINGS:
        old, new = before.get(key), now.get(key)
        if old == new:
            continue
        if key == "thread_variables":
            old, new = old or {}, new or {}
            for name in sorted(set(old) | set(new)):
                if old.get(name) != new.get(name):
                    said.append(f"{name} {old.get(name, 'unset')} -> {new.get(name, 'unset')}")
        else:  # a setting a record from before convattn recorded it lacks: "not recorded"
            said.append(f"{key.replace('_', ' ')} {old if key in before else 'not recorded'} -> {new}")
    return said


def describe(entry: dict, load: bool = True) -> str:
    """One line: 'cpu (AMD EPYC, 2 threads of 2 cores), 1 process, fp32, torch 2.13.0+cpu, ..., the thread
    variables set, the load average at the start (with `load`)'."""
    if entry.get("device") == "cuda":
        place = f"cuda ({entry.get('device_name')})"
    else:
        place = (f"cpu ({entry.get('device_name')}, {entry.get('threads')} threads of {entry.get('cpu_cores')} "
                 "cores)")
    processes = entry.get("processes")
    parts = [place, f"{processes} process{'' if processes == 1 else 'es'}", str(entry.get("precision")),
             f"torch {entry.get('torch')}", f"transformers {entry.get('transformers')}",
             f"convattn {entry.get('convattn')}" + (f" (code {entry[SOURCE]})" if entry.get(SOURCE) else "")]
    if entry.get("denormals"):
        parts.append(f"denormals {entry['denormals']}")
    variables = entry.get("thread_variables") or {}
    if variables:
        parts.append(" ".join(f"{name}={value}" for name, value in variables.items()))
    if load and entry.get("load_average") is not None:
        parts.append(f"load average {entry['load_average']} at the start")
    return ", ".join(parts)
