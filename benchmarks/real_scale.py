"""The first real-scale run: chang2021-small/composite against chang2021-small/absolute at the papers' width and
depth (L 12, H 256, 4 heads, n 128, batch 128, the chang2021-small recipe), the same wall-clock training budget
each on one GPU, then GLUE dev (CoLA, SST-2, MRPC, 3 seeds) of both: one `convattn compare`.

Two stages, because the GPU machine has no network and no ../shared:

  pack  here, beside ../shared/data: writes the kit, .gpu-kit/ (about 40 MB, carried to the GPU machine): the
        training text (62 MB of Wikipedia and 50 MB of books, xz-compressed), WikiText-103 valid for evaluation,
        the GLUE tasks, a 30,004-piece unigram tokenizer trained here on the training text (the recipe's size),
        and the wheels of the Python packages the GPU machine lacks (benchmarks/gpu.sh installs them there).
  run   on the GPU machine, through benchmarks/gpu.sh: unpacks the kit into .gpu-work/, runs the comparison
        until --stop-after seconds have passed, then interrupts it the way Ctrl-C does (the next `run`
        continues it, the training clock included: a row resumes from its last checkpoint with the time it
        had spent), and copies the report to --out. Its last line says "finished" or "run again".

    python benchmarks/real_scale.py pack                                     # here (a few minutes)
    bash benchmarks/gpu.sh python3 benchmarks/real_scale.py run --out $OUT   # there, again until "finished"

STS-B and RTE, which the issue names too, are not in ../shared/data, and the GPU machine cannot reach the hub.
SST-2 fine-tunes on a fixed random 20,000 of its 67,349 examples by default (--glue-max-train-samples), so that
both models' GLUE fits in about one device call; CoLA and MRPC are whole.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from convattn.files import atomic_path, write_json_atomic

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
KIT, WORK = ROOT / ".gpu-kit", ROOT / ".gpu-work"
TEXT_SOURCES = ("enwiki-2015-sample", "gutenberg-books")
EVAL_FILE = "wiki.valid.raw"
GLUE_TASKS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC"}
PRESETS = "chang2021-small/absolute,chang2021-small/composite"
VOCAB_SIZE = 30004  # the chang2021-small recipe's
# What the GPU machine's image (Python 3.12, torch 2.11, transformers 5.17, huggingface_hub 1.33, tokenizers
# 0.23.2, pyarrow, pandas, fsspec, xxhash, ...) lacks: `datasets` and its own dependencies, and a tokenizers
# without 0.23.2's bug (truncation with overflowing tokens drops windows, huggingface/tokenizers#2091).
# Checked in a Python 3.12 environment with the image's versions.
WHEELS = ("datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19", "tokenizers==0.23.3")
# Files of the comparison's report brought back (the device tool returns at most 8 files from $OUT).
REPORT_FILES = ("report.md", "summary.csv", "metrics.csv", "perplexity.png")
KIT_MARKER = ".real_scale-kit"  # in a kit folder this script made, which pack may then rewrite


def say(message: str) -> None:
    print(f"real_scale: {message}", flush=True)


def write_tar(target: Path, members: dict[str, Path]) -> None:
    """An xz-compressed tar of `members` (name in the archive -> file), written whole or not at all."""
    with atomic_path(target) as tmp, tarfile.open(tmp, "w:xz", preset=6) as tar:
        for name, path in members.items():
            tar.add(path, arcname=name)


def text_files(limit_bytes: int | None) -> dict[str, Path]:
    """The training text's files, both sources taking turns, whole files up to `limit_bytes` in all."""
    sources = [sorted((SHARED / source).glob("*.txt")) for source in TEXT_SOURCES]
    chosen, total = {}, 0
    for index in range(max(len(files) for files in sources)):
        for source, files in zip(TEXT_SOURCES, sources, strict=True):
            if index < len(files):
                if limit_bytes is not None and total + files[index].stat().st_size > limit_bytes and chosen:
                    return chosen
                chosen[f"corpus/{source}/{files[index].name}"] = files[index]
                total += files[index].stat().st_size
    return chosen


def train_kit_tokenizer(files: dict[str, Path], kit: Path, vocab_size: int) -> None:
    """The shared tokenizer, trained by convattn itself on the training text, saved in kit/tokenizer."""
    import datasets

    from convattn.data.corpus import load_corpus
    from convattn.data.tokenizer import train_tokenizer

    datasets.disable_progress_bars()

    with tempfile.TemporaryDirectory(dir=kit) as scratch:
        corpus = load_corpus(None, None, [str(path) for path in files.values()], [str(SHARED / "wikitext-103-raw" /
                             EVAL_FILE)], Path(scratch) / "cache")
        tokenizer = train_tokenizer(corpus.train, vocab_size, 128, Path(scratch))
        staged = Path(scratch) / "tokenizer"
        tokenizer.save_pretrained(str(staged))
        shutil.rmtree(kit / "tokenizer", ignore_errors=True)
        staged.replace(kit / "tokenizer")


def download_wheels(kit: Path) -> None:
    wheels = kit / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d", str(wheels),
                    *WHEELS], check=True)


def pack(args) -> int:
    if not SHARED.is_dir():
        sys.exit(f"real_scale pack: {SHARED} is missing: pack runs beside the shared data")
    kit = args.kit
    if kit.is_dir() and any(kit.iterdir()) and not (kit / KIT_MARKER).is_file():
        sys.exit(f"real_scale pack: {kit} holds files this script did not write; give an empty or new --kit")
    kit.mkdir(parents=True, exist_ok=True)
    (kit / KIT_MARKER).touch()
    files = text_files(args.text_mb * 2**20 if args.text_mb else None)
    say(f"training text: {len(files)} files, {sum(p.stat().st_size for p in files.values()) / 2**20:.0f} MiB")
    say(f"training the {args.vocab_size:,}-piece tokenizer on it")
    train_kit_tokenizer(files, kit, args.vocab_size)
    say("compressing the text and GLUE")
    write_tar(kit / "corpus.tar.xz", files)
    glue = {f"glue_data/{folder}/{file.name}": file for folder in GLUE_TASKS.values()
            for file in sorted((SHARED / "glue_data" / folder).glob("*.tsv"))}
    write_tar(kit / "eval.tar.xz", {EVAL_FILE: SHARED / "wikitext-103-raw" / EVAL_FILE, **glue})
    if args.wheels:
        say("downloading the wheels the GPU machine lacks")
        download_wheels(kit)
    size = sum(p.stat().st_size for p in kit.rglob("*") if p.is_file())
    say(f"wrote {kit} ({size / 2**20:.1f} MiB): carry it to the GPU machine")
    return 0


def unpack(kit: Path, work: Path) -> None:
    """The kit's archives under `work`, each unpacked once (into a temporary folder, then renamed)."""
    work.mkdir(parents=True, exist_ok=True)
    for archive, marker in (("corpus.tar.xz", "corpus"), ("eval.tar.xz", EVAL_FILE)):
        if (work / marker).exists():
            continue
        staged = Path(tempfile.mkdtemp(dir=work, prefix=".unpack-"))
        with tarfile.open(kit / archive) as tar:
            tar.extractall(staged, filter="data")
        for item in staged.iterdir():
            item.replace(work / item.name)
        staged.rmdir()


def compare_command(args, work: Path) -> list[str]:
    smoke = ["--layers", "1", "--hidden", "64", "--heads", "2", "--intermediate", "128", "--batch-size", "8",
             "--eval-samples", "32", "--glue-max-steps", "3"] if args.smoke else []
    return [
        sys.executable, "-m", "convattn", "compare", "--presets", PRESETS, "--recipe", "chang2021-small",
        "--time-budget", args.budget, "--warmup", "0.08", "--seeds", "1",
        "--train-file", str(work / "corpus"), "--eval-file", str(work / EVAL_FILE),
        "--tokenizer", str(args.kit / "tokenizer"), "--eval-samples", str(args.eval_samples),
        "--glue", args.glue, "--glue-data-dir", str(work / "glue_data"), "--glue-seeds", str(args.glue_seeds),
        "--glue-max-train-samples", str(args.glue_max_train_samples),
        "--output-dir", str(work / "compare"), "--cache-dir", str(work / "cache"),
        *(["--compile"] if args.compile else []), *smoke,
    ]


def run_until(command: list[str], stop_after: float, log) -> int | None:
    """Run `command` (its output to `log`); interrupt it as Ctrl-C does once `stop_after` seconds have passed.
    Returns its exit code."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        return process.wait(timeout=stop_after)
    except subprocess.TimeoutExpired:
        say(f"{stop_after:.0f} s passed: interrupting the comparison (it keeps its last checkpoint)")
        process.send_signal(signal.SIGINT)
        try:
            return process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()


def machine() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def run(args) -> int:
    import torch

    if not torch.cuda.is_available() and not args.smoke:
        sys.exit("real_scale run: no CUDA GPU here (--smoke runs a tiny version on CPU)")
    if not (args.kit / "tokenizer").is_dir():
        sys.exit(f"real_scale run: no kit at {args.kit}: run `python benchmarks/real_scale.py pack` beside "
                 "../shared first and carry the kit")
    work, out = args.work, args.out
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    unpack(args.kit, work)
    command = compare_command(args, work)
    say("$ " + " ".join(command))
    with open(work / "compare.log", "a") as log:
        code = run_until(command, args.stop_after - (time.monotonic() - start), log)
    report = work / "compare"
    for name in REPORT_FILES:
        if (report / name).is_file():
            shutil.copy(report / name, out / name)
    shutil.copy(work / "compare.log", out / "compare.log")
    finished = code == 0
    status = {"finished": finished, "exit_code": code, "seconds": round(time.monotonic() - start, 1),
              "command": command[1:], "machine": machine()}
    write_json_atomic(out / "real_scale.json", status)
    say(f"exit code {code} after {status['seconds']:.0f} s; report in {out}")
    if finished:
        say("finished")
        return 0
    say("not finished: run the same command again to continue")
    return 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    stages = parser.add_subparsers(dest="stage", required=True)
    packing = stages.add_parser("pack", help="here: write the kit the GPU machine needs")
    packing.add_argument("--text-mb", type=int, help="at most this much training text (default: all of it)")
    packing.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    packing.add_argument("--no-wheels", dest="wheels", action="store_false", help="skip downloading the wheels")
    unpacking = stages.add_parser("unpack", help="on the GPU machine: only unpack the kit into --work")
    running = stages.add_parser("run", help="on the GPU machine: run or continue the comparison")
    running.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", WORK / "out")),
                         help="where the report goes (default: $OUT)")
    running.add_argument("--budget", default="4m", help="training time of each model (default: 4m)")
    running.add_argument("--stop-after", type=float, default=540,
                         help="interrupt after this many seconds (default: 540, inside a 10-minute device call)")
    running.add_argument("--glue", default=",".join(GLUE_TASKS))
    running.add_argument("--glue-seeds", type=int, default=3)
    running.add_argument("--glue-max-train-samples", type=int, default=20000)
    running.add_argument("--eval-samples", type=int, default=2048)
    running.add_argument("--compile", action="store_true", help="torch.compile the models")
    running.add_argument("--smoke", action="store_true", help="a tiny model that runs on CPU (tests)")
    for stage in (unpacking, running):
        stage.add_argument("--work", type=Path, default=WORK)
    for stage in (packing, unpacking, running):
        stage.add_argument("--kit", type=Path, default=KIT)
    args = parser.parse_args()
    if args.stage == "unpack":
        unpack(args.kit, args.work)
        return 0
    return pack(args) if args.stage == "pack" else run(args)


if __name__ == "__main__":
    sys.exit(main())
