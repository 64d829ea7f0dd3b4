"""What keying the tokenization cache by content costs: SHA-256 of every file of a corpus (`content_digest`, on
every run) against the UTF-8 check the same files already get (`check_text_file`) and a plain read, best of
`--reps`, in one process. Nothing here asserts a time. Results go to benchmarks/results/cache_key.md.

    python benchmarks/cache_key.py                               # ../shared/data/enwiki-2015-sample (62 MB)
    python benchmarks/cache_key.py --corpus DIR --reps 5
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from convattn.data.corpus import check_text_file, content_digest, resolve_text_files
from convattn.files import write_text_atomic

ROOT = Path(__file__).resolve().parents[1]


def best_seconds(work, files: list[Path], reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        for path in files:
            work(path)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(ROOT.parent / "shared" / "data" / "enwiki-2015-sample"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "cache_key.md")
    args = parser.parse_args()
    files = resolve_text_files([args.corpus])
    megabytes = sum(p.stat().st_size for p in files) / 1e6
    arms = {
        "plain read": lambda path: path.read_bytes(),
        "UTF-8 check (check_text_file)": lambda path: check_text_file(path, "--train-file"),
        "SHA-256 key (content_digest)": content_digest,
    }
    rows = [f"| {name} | {best_seconds(work, files, args.reps):.3f} |" for name, work in arms.items()]
    report = "\n".join([f"# Cache key cost: {len(files)} files, {megabytes:.1f} MB ({args.corpus})", "",
                        f"best of {args.reps}, seconds for all files", "", "| work | seconds |", "|---|---|",
                        *rows, ""])
    write_text_atomic(args.output, report)
    print(report)


if __name__ == "__main__":
    main()
