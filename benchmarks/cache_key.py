"""What keying the tokenization cache by content costs: SHA-256 of every file of a corpus (`content_digest`, on
every run) against the UTF-8 check the same files already get (`check_text_file`) and a plain read, best of
`--reps`, in one process. Nothing here asserts a time. Results go to benchmarks/results/cache_key.md.

    python benchmarks/cache_key.py                               # ../shared/data/enwiki-2015-sample (62 MB)
    python benchmarks/cache_key.py --corpus DIR --reps 5
"""

from __future__ import annotations

import argparse
from pathlib import Path

import harness

from convattn.data.corpus import check_text_file, content_digest, resolve_text_files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(harness.DATA / "enwiki-2015-sample"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--output", type=Path, default=harness.RESULTS / "cache_key.md")
    args = parser.parse_args()
    files = resolve_text_files([args.corpus])
    megabytes = sum(p.stat().st_size for p in files) / 1e6
    arms = {
        "plain read": lambda path: path.read_bytes(),
        "UTF-8 check (check_text_file)": lambda path: check_text_file(path, "--train-file"),
        "SHA-256 key (content_digest)": content_digest,
    }
    with harness.Run("cache_key", machine=harness.machine_line(threads=False), corpus=args.corpus, files=len(files),
                     megabytes=round(megabytes, 1), reps=args.reps) as run:
        seconds = {name: harness.least_per_call(lambda work=work: [work(path) for path in files], 1, args.reps)
                   for name, work in arms.items()}
        for name, value in seconds.items():
            run.add(work=name, seconds=round(value, 4))
    report = "\n".join([f"# Cache key cost: {len(files)} files, {megabytes:.1f} MB ({args.corpus})", "",
                        f"best of {args.reps}, seconds for all files", "", "| work | seconds |", "|---|---|",
                        *(f"| {name} | {value:.3f} |" for name, value in seconds.items()), ""])
    harness.report(args.output, report, quiet=True)
    print(report)


if __name__ == "__main__":
    main()
