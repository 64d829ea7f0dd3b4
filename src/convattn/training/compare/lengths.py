"""Length generalisation in a comparison (`convattn compare --eval-lengths 128,512,1024`).

Every finished run and seed is scored by `length_eval.evaluate_at_lengths` on the comparison's eval files at
each length (the papers train at 128), on the eval text's first `--eval-length-blocks` blocks of the longest length;
the scores are cached per seed in `length_eval.json` (keyed on the lengths, the blocks, the eval files and the run's
weights, so a second report costs nothing) and summarised in the output directory:

    lengths.md      one row per run: eval perplexity mean ± SEM over seeds at each length
    lengths.csv     one row per run x seed x length
    lengths.png     perplexity vs input length, one line per run

Models with absolute positions (or Linformer projections) past their maximum length are reported as unable
to extend, not run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from convattn.console import say
from convattn.errors import UsageError, option
from convattn.files import model_identity, read_json, save_figure, write_json_atomic, write_text_atomic
from convattn.runs.pretrain import FINISHED, LENGTHS_FILE, run_state
from convattn.training.compare.options import CompareOptions
from convattn.training.length_eval import MASK_PROBABILITY, MAX_BLOCKS
from convattn.training.seed_statistics import format_mean_sem, mean_sem


@dataclass(frozen=True)
class LengthRequest:
    """What `--eval-lengths` asks for: these lengths, scored on `blocks` blocks of the longest (None: all the text)."""

    lengths: list[int]
    blocks: int | None = MAX_BLOCKS


def parse_blocks(text: str) -> int | None:
    """`--eval-length-blocks`: a positive count, or "all" (None: the whole eval text)."""
    if text.strip().lower() == "all":
        return None
    try:
        blocks = int(text)
    except ValueError:
        blocks = 0
    if blocks < 1:
        raise UsageError(f"{option('eval_length_blocks')} {text!r}: give a positive number of blocks of the longest "
                         "length, or all (the whole eval text)")
    return blocks


def parse_lengths(text: str) -> list[int]:
    try:
        lengths = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{option('eval_lengths')} {text!r}: expected comma-separated integers, e.g. "
                         "128,512,1024") from None
    if not lengths or any(n < 3 for n in lengths):
        raise UsageError(f"{option('eval_lengths')} {text!r}: every length must be an integer >= 3")
    if repeated := sorted({n for n in lengths if lengths.count(n) > 1}):
        raise UsageError(f"{option('eval_lengths')} {text!r}: {', '.join(map(str, repeated))} given more than once "
                         "(each length is one column of the report); give each length once")
    return lengths


def eval_files(options: CompareOptions) -> list[str]:
    files = [str(path) for path in options.data.get("eval_files") or []]
    if not files:
        raise UsageError(f"{option('eval_lengths')} needs {option('eval_file')} (the text every run is scored on at "
                         "each length)")
    return files


def seed_scores(path: Path, request: LengthRequest, files: list[str]) -> dict:
    """{"lengths": [...], "max_blocks": n, "files": [...], "model": fingerprint, "protocol": n, "results": [{length,
    perplexity, note, masked_tokens}, ...]}, cached in the seed dir for these lengths, blocks, files, model
    (`model_identity` of the run's weights) and length_eval's PROTOCOL."""
    from convattn.training.length_eval import PROTOCOL, evaluate_at_lengths

    cache = path / LENGTHS_FILE
    record = read_json(cache) if cache.is_file() else None
    model = model_identity(path)  # a run trained again (pretrain --overwrite into the seed folder) is scored again
    wanted = {"lengths": request.lengths, "max_blocks": request.blocks, "files": files, "model": model,
              "protocol": PROTOCOL}
    if record and all(key in record and record[key] == value for key, value in wanted.items()):
        return record
    results = evaluate_at_lengths(path, files, request.lengths, max_blocks=request.blocks)
    record = {**wanted, "results": [{"length": r.length, "perplexity": r.perplexity, "note": r.note,
                                     "masked_tokens": r.masked_tokens} for r in results]}
    write_json_atomic(cache, record)
    return record


def evaluate_lengths(options: CompareOptions, request: LengthRequest) -> dict[str, dict[int, list[dict]]]:
    """run name -> seed -> per-length results, for every finished run and seed."""
    files = eval_files(options)
    scores: dict[str, dict[int, list[dict]]] = {}
    for spec in options.grid.runs:
        for seed in range(options.seeds):
            path = options.run_path(spec, seed)
            if run_state(path) != FINISHED:
                continue
            say("compare", f"{spec.name} seed {seed}: eval perplexity at lengths "
                           f"{','.join(map(str, request.lengths))}")
            scores.setdefault(spec.name, {})[seed] = seed_scores(path, request, files)["results"]
    return scores


def length_table(scores: dict[str, dict[int, list[dict]]], lengths: list[int]) -> list[str]:
    lines = ["| Run | Seeds | " + " | ".join(f"n = {n:,}" for n in lengths) + " |",
             "|---|---:|" + "---:|" * len(lengths)]
    for run, seeds in scores.items():
        cells = []
        for index, _ in enumerate(lengths):
            values = [results[index]["perplexity"] for results in seeds.values()]
            if any(value is None for value in values):
                cells.append(next(r[index]["note"] for r in seeds.values() if r[index]["perplexity"] is None))
            else:
                cells.append(format_mean_sem(mean_sem(values), digits=1))
        lines.append(f"| {run} | {len(seeds)} | " + " | ".join(cells) + " |")
    return lines


def write_length_report(options: CompareOptions, request: LengthRequest) -> list[str]:
    """lengths.md, lengths.csv and lengths.png in the output directory; returns the markdown table."""
    lengths = request.lengths
    scores = evaluate_lengths(options, request)
    out = options.output_dir
    table = length_table(scores, lengths)
    text = ("all of it" if request.blocks is None else
            f"its first {request.blocks:,} blocks of {max(lengths):,} tokens (--eval-length-blocks)")
    intro = (f"Masked-LM eval perplexity at each input length on {', '.join(eval_files(options))}, {text}: the same "
             f"tokens at every length ({round(100 * MASK_PROBABILITY)} % of tokens masked, the same ones for every "
             "length and run), mean ± SEM over seeds. Which tokens are masked moves a score by itself (4-6 % between "
             "two draws on 65,408 tokens); every run and length here shares one draw, so their differences are paired.")
    write_text_atomic(out / "lengths.md", "\n".join(["# Length generalisation", "", intro, "", *table]) + "\n")
    rows = ["run,seed,length,perplexity,masked_tokens,note"]
    rows += [f"{run},{seed},{r['length']},{'' if r['perplexity'] is None else r['perplexity']},"
             f"{r['masked_tokens']},{r['note']}"
             for run, seeds in scores.items() for seed, results in seeds.items() for r in results]
    write_text_atomic(out / "lengths.csv", "\n".join(rows) + "\n")
    plot_lengths(scores, lengths, out / "lengths.png")
    return table


def unscored_lengths(seeds: dict[int, list[dict]], lengths: list[int]) -> dict[str, list[int]]:
    """The lengths a run has no perplexity at, in the figure's words: those past its positions ("cannot extend
    to"), and the others (too little eval text, or no token masked there: "not scored at")."""
    unscored: dict[str, list[int]] = {"cannot extend to": [], "not scored at": []}
    for i, n in enumerate(lengths):
        notes = [r[i]["note"] for r in seeds.values() if r[i]["perplexity"] is None]
        if notes:
            extends = all(note.startswith("cannot extend") for note in notes)
            unscored["cannot extend to" if extends else "not scored at"].append(n)
    return unscored


def plot_lengths(scores: dict[str, dict[int, list[dict]]], lengths: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run, seeds in scores.items():
        points = [(n, mean_sem([r[i]["perplexity"] for r in seeds.values()])["mean"]) for i, n in enumerate(lengths)
                  if all(r[i]["perplexity"] is not None for r in seeds.values())]
        label = run + "".join(f" ({why} {', '.join(map(str, unscored))})" for why, unscored in unscored_lengths(
            seeds, lengths).items() if unscored)
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    ax.set_title("Eval perplexity at other input lengths (length generalisation)")
    ax.set_xlabel("input length (tokens)")
    ax.set_ylabel("eval perplexity")
    ax.legend(fontsize="small")
    fig.tight_layout()
    save_figure(fig, path)
