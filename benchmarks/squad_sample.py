"""SQuAD v1.1 on the shared 3-article sample: a pretrained checkpoint fine-tuned on one article, scored on
another, against the trivial baselines (RESULTS.md §8).

The sample (../shared/data/squad/squad-v1.1-dev-sample.json) is split by article (by default: train on
United_Methodist_Church, evaluate on Force), so no context is seen in both training and evaluation. Writes
OUT/train.json and OUT/dev.json (the split), OUT/baselines.json (the first sentence of the context as the
answer, and the empty answer, scored with convattn's official-equivalent scorer), runs `convattn squad` into
OUT/squad and writes OUT/squad_sample.md with both.

    python benchmarks/squad_sample.py --model runs/my-checkpoint --out benchmarks/results/squad-sample \
        --dev-article Force -- --seeds 3 --max-steps 300 --max-length 256 --batch-size 16
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from convattn.training.squad.metrics import squad_scores

SAMPLE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "squad" / "squad-v1.1-dev-sample.json"


def first_sentence(context: str) -> str:
    return re.split(r"(?<=[.!?])\s", context.strip(), maxsplit=1)[0]


def baselines(dev: dict) -> dict[str, dict]:
    answers, first = {}, {}
    for article in dev["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers[qa["id"]] = [a["text"] for a in qa["answers"]]
                first[qa["id"]] = first_sentence(paragraph["context"])
    return {"first sentence": squad_scores(answers, first, "1.1"),
            "empty answer": squad_scores(answers, dict.fromkeys(answers, ""), "1.1")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="pretrained checkpoint directory")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sample", type=Path, default=SAMPLE)
    parser.add_argument("--dev-article", default="Force", help="the article held out for evaluation")
    parser.add_argument("--train-articles", default="United_Methodist_Church",
                        help="comma-separated training articles (Technical_components is not SQuAD text: its "
                             "answer_starts miss their answers, so it cannot give training labels)")
    parser.add_argument("squad_args", nargs="*", help="more `convattn squad` flags (after --)")
    args = parser.parse_args()

    sample = json.loads(args.sample.read_text())
    titles = [a["title"] for a in sample["data"]]
    train_titles = args.train_articles.split(",")
    if args.dev_article not in titles or not set(train_titles) <= set(titles) or args.dev_article in train_titles:
        sys.exit(f"--dev-article and --train-articles must be different articles of {titles}")
    train = {"version": "1.1", "data": [a for a in sample["data"] if a["title"] in train_titles]}
    dev = {"version": "1.1", "data": [a for a in sample["data"] if a["title"] == args.dev_article]}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in (("train.json", train), ("dev.json", dev)):
        (args.out / name).write_text(json.dumps(data) + "\n")
    trivial = baselines(dev)
    (args.out / "baselines.json").write_text(json.dumps(trivial, indent=2) + "\n")

    command = [sys.executable, "-m", "convattn", "squad", "--model", args.model, "--version", "1.1",
               "--train-file", str(args.out / "train.json"), "--dev-file", str(args.out / "dev.json"),
               "--output-dir", str(args.out / "squad"), *args.squad_args]
    start = time.time()
    subprocess.run(command, check=True)
    seconds = time.time() - start
    results = json.loads((args.out / "squad" / "squad_results.json").read_text())

    def cell(stat) -> str:
        return f"{stat['mean']:.1f}" + (f" ± {stat['sem']:.1f}" if stat["sem"] is not None else "")

    n_train = sum(len(p["qas"]) for a in train["data"] for p in a["paragraphs"])
    n_dev = sum(len(p["qas"]) for a in dev["data"] for p in a["paragraphs"])
    lines = [
        f"# SQuAD v1.1 sample: train on {', '.join(a['title'] for a in train['data'])} ({n_train} questions), "
        f"evaluate on {args.dev_article} ({n_dev} questions)",
        "",
        f"Model: `{args.model}`; `convattn squad` flags: `{' '.join(args.squad_args)}`; wall time {seconds:.0f} s "
        f"for {len(results['seeds'])} seed(s) (fine-tuning and evaluation).",
        "",
        "| Answer | EM | F1 |",
        "|---|---:|---:|",
        f"| fine-tuned (mean ± SEM over seeds {results['seeds']}) | {cell(results['scores']['exact_match'])} | "
        f"{cell(results['scores']['f1'])} |",
    ]
    lines += [f"| {name} | {s['exact_match']:.1f} | {s['f1']:.1f} |" for name, s in trivial.items()]
    (args.out / "squad_sample.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
