"""SQuAD v1.1 on the shared 3-article sample: a pretrained checkpoint fine-tuned on some articles and scored
on a held-out one, against the trivial baselines (RESULTS.md section 7.2).

The sample (../shared/data/squad/squad-v1.1-dev-sample.json) is split by article, so no context is seen in
both training and evaluation. Each of `--articles` is held out once (a fold), the model being fine-tuned on
the others; by default the two SQuAD articles, United_Methodist_Church and Force (Technical_components is not
SQuAD text: its answer_starts miss their answers, so it cannot give training labels). Per fold, OUT/<held-out
article>/ gets train.json and dev.json (the split), baselines.json (the first sentence of the context as the
answer, and the empty answer, scored with convattn's official-equivalent scorer) and the `convattn squad` run
folder squad/; OUT/squad_sample.md has every fold and the mean over folds.

    python benchmarks/squad_sample.py --model runs/my-checkpoint --out benchmarks/results/squad-sample \
        -- --seeds 3 --max-steps 300 --max-length 256 --batch-size 16
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from statistics import mean

import harness

from convattn.training.squad.metrics import squad_scores
from convattn.training.squad.run import squad_seed_dir

SAMPLE = harness.DATA / "squad" / "squad-v1.1-dev-sample.json"
METRICS = ("exact_match", "f1")


def first_sentence(context: str) -> str:
    return re.split(r"(?<=[.!?])\s", context.strip(), maxsplit=1)[0]


def paragraphs(data: dict):
    """Every paragraph (context and its questions) of a SQuAD JSON document."""
    return (paragraph for article in data["data"] for paragraph in article["paragraphs"])


def baselines(dev: dict) -> dict[str, dict]:
    answers, first = {}, {}
    for paragraph in paragraphs(dev):
        for qa in paragraph["qas"]:
            answers[qa["id"]] = [a["text"] for a in qa["answers"]]
            first[qa["id"]] = first_sentence(paragraph["context"])
    return {"first sentence": squad_scores(answers, first, "1.1"),
            "empty answer": squad_scores(answers, dict.fromkeys(answers, ""), "1.1")}


def shared_answers(dev: dict, answer: dict[str, str]) -> float:
    """Percentage of questions whose answer is also another question's answer in the same paragraph: near the
    gold answers' own rate for a model that reads the question, near 100 for one that answers each paragraph
    with one span whatever the question."""
    shared = total = 0
    for paragraph in paragraphs(dev):
        counts = Counter(answer[qa["id"]] for qa in paragraph["qas"])
        shared += sum(n for n in counts.values() if n > 1)
        total += len(paragraph["qas"])
    return 100 * shared / total


def questions(data: dict) -> int:
    return sum(len(paragraph["qas"]) for paragraph in paragraphs(data))


def run_fold(sample: dict, held_out: str, train_titles: list[str], args) -> dict:
    """Fine-tune on `train_titles`, score on `held_out`; returns the fold's scores (fine-tuned and baselines)."""
    out = args.out / held_out
    out.mkdir(parents=True, exist_ok=True)
    train = {"version": "1.1", "data": [a for a in sample["data"] if a["title"] in train_titles]}
    dev = {"version": "1.1", "data": [a for a in sample["data"] if a["title"] == held_out]}
    for name, data in (("train.json", train), ("dev.json", dev)):
        (out / name).write_text(json.dumps(data) + "\n")
    trivial = baselines(dev)
    (out / "baselines.json").write_text(json.dumps(trivial, indent=2) + "\n")
    harness.convattn(["squad", "--model", args.model, "--version", "1.1", "--train-file", str(out / "train.json"),
                      "--dev-file", str(out / "dev.json"), "--output-dir", str(out / "squad"), *args.squad_args],
                     quiet=False)
    results = json.loads((out / "squad" / "squad_results.json").read_text())
    seeds = [squad_seed_dir(out / "squad", "1.1", seed) for seed in results["seeds"]]
    shared = [shared_answers(dev, json.loads((seed / "predictions.json").read_text())) for seed in seeds]
    seconds = sum(json.loads((seed / "run.json").read_text())["seconds"] for seed in seeds)
    gold = shared_answers(dev, {qa["id"]: qa["answers"][0]["text"] for p in paragraphs(dev) for qa in p["qas"]})
    return {"held_out": held_out, "train": train_titles, "train_questions": questions(train),
            "dev_questions": questions(dev), "seconds": seconds, "seeds": results["seeds"],
            "fine_tuned": results["scores"], "baselines": trivial,
            "shared_answers": {"fine_tuned": mean(shared), "gold": gold}}


def cell(stat: dict) -> str:
    return f"{stat['mean']:.1f}" + (f" ± {stat['sem']:.1f}" if stat["sem"] is not None else "")


def report(folds: list[dict], args) -> str:
    seconds = sum(f["seconds"] for f in folds)
    lines = [
        "# SQuAD v1.1 sample, split by article: fine-tuned on the other articles, scored on the held-out one",
        "",
        f"Model: `{args.model}`; `convattn squad` flags: `{' '.join(args.squad_args)}`; wall time {seconds:.0f} s "
        f"for {len(folds)} fold(s) x {len(folds[0]['seeds'])} seed(s) (fine-tuning and evaluation, summed over "
        "runs). Fine-tuned "
        "scores are mean ± SEM over seeds. Shared answers: the percentage of questions answered with the same "
        "text as another question of their paragraph (mean over seeds; the gold answers' own rate after the slash): "
        "near 100 when the model answers each paragraph with one span whatever the question.",
        "",
        "| held out (questions) | trained on (questions) | fine-tuned EM | fine-tuned F1 | first sentence EM / F1 "
        "| empty answer EM / F1 | shared answers, % |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for f in folds:
        first, empty = f["baselines"]["first sentence"], f["baselines"]["empty answer"]
        lines.append(
            f"| {f['held_out']} ({f['dev_questions']}) | {', '.join(f['train'])} ({f['train_questions']}) | "
            f"{cell(f['fine_tuned']['exact_match'])} | {cell(f['fine_tuned']['f1'])} | "
            f"{first['exact_match']:.1f} / {first['f1']:.1f} | {empty['exact_match']:.1f} / {empty['f1']:.1f} | "
            f"{f['shared_answers']['fine_tuned']:.0f} / {f['shared_answers']['gold']:.0f} |")
    if len(folds) > 1:
        tuned = {m: mean(f["fine_tuned"][m]["mean"] for f in folds) for m in METRICS}
        first = {m: mean(f["baselines"]["first sentence"][m] for f in folds) for m in METRICS}
        empty = {m: mean(f["baselines"]["empty answer"][m] for f in folds) for m in METRICS}
        lines.append(f"| mean over folds | | {tuned['exact_match']:.1f} | {tuned['f1']:.1f} | "
                     f"{first['exact_match']:.1f} / {first['f1']:.1f} | {empty['exact_match']:.1f} / "
                     f"{empty['f1']:.1f} | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="pretrained checkpoint directory")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sample", type=Path, default=SAMPLE)
    parser.add_argument("--articles", default="United_Methodist_Church,Force",
                        help="comma-separated articles; each is held out once and the model trained on the others")
    parser.add_argument("squad_args", nargs="*", help="more `convattn squad` flags (after --)")
    args = parser.parse_args()

    sample = json.loads(args.sample.read_text())
    titles = [a["title"] for a in sample["data"]]
    articles = args.articles.split(",")
    if len(articles) < 2 or len(set(articles)) < len(articles) or not set(articles) <= set(titles):
        sys.exit(f"--articles must name two or more different articles of {titles}")
    with harness.Run("squad_sample", model=args.model, squad_args=args.squad_args) as run:
        folds = [run.add(**run_fold(sample, held_out, [a for a in articles if a != held_out], args))
                 for held_out in articles]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "squad_sample.json").write_text(json.dumps(folds, indent=2) + "\n")
    text = report(folds, args)
    (args.out / "squad_sample.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
