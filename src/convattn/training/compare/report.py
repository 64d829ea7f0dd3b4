"""The report of a comparison: report.md and report.html from the results that results.py reads back from the
run directories (it also writes the CSVs and the figure); cells.py formats the table cells.

See `convattn.training.compare` for the directory layout.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from convattn.files import read_json, write_json_atomic, write_text_atomic
from convattn.runs.environment import changes, code_change, describe, recorded_environments
from convattn.runs.pretrain import DATA_FILE, LEGACY_CLOCK, OPTIONS_FILE
from convattn.training.compare.cells import (
    TEXT_COLUMNS,
    clear_winner,
    count,
    html_cell,
    markdown_table,
    mean_std,
    number,
)
from convattn.training.compare.options import CompareOptions, run_options
from convattn.training.compare.results import (
    MIB,
    RunResult,
    collect_results,
    downstream_columns,
    plot_perplexity_by_cost,
    plot_perplexity_curves,
    write_metrics_csv,
    write_summary_csv,
)
from convattn.training.pretrain.budget import CLOCK_EXPLAINED, CLOCK_WORDS, EVALUATIONS, SLOWED_SHARE, format_duration

# ---------------------------------------------------------------------------------- report
REPORT_RUNS = "report_runs.json"  # beside a report: the runs it covers
CURVES_NOTE = ("One line per run: the mean over its finished seeds (all seeds while none has finished), each seed's "
               "curve interpolated onto the points any seed evaluated at within the range every seed covers; the "
               "band spans the seeds' minimum and maximum there. Seeds that reach different steps (a time budget) "
               "end the line at the last step all of them reach.")
COST_NOTE = ("The same curves against training time (the budget's clock: training steps only, stopped at the "
             "deadline, so the line ends at the reported mean) and against the tokens each seed had seen.")


SLOWED_ROW = 0.1  # a run whose steps were slowed this often by other processes is marked in the report


def step_spread(spread: dict | None) -> str:
    return f"{spread['median']:.3g} [{spread['p10']:.3g}, {spread['p90']:.3g}]" if spread else "–"


def slowed(share: float | None) -> str:
    if share is None:
        return "–"
    return f"{share:.0%}" + (" (slowed)" if share > SLOWED_ROW else "")


def report_dir(options: CompareOptions) -> Path:
    """Where the report of these runs goes: the output folder, unless its report covers runs these do not (a
    --report-only of a subset): then subsets/<runs>/, so the full report stays."""
    runs = [spec.slug for spec in options.grid.runs]
    covered = read_json(options.output_dir / REPORT_RUNS) or runs
    if set(covered) <= set(runs):
        return options.output_dir
    return options.output_dir / "subsets" / "+".join(runs)[:150]


def write_report(options: CompareOptions) -> tuple[list[RunResult], Path]:
    """report.md, report.html, perplexity.png (and perplexity_cost.png for a time budget), metrics.csv and
    summary.csv from the run directories; returns the results and the folder they went to (`report_dir`)."""
    results = collect_results(options)
    out = report_dir(options)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / REPORT_RUNS, [spec.slug for spec in options.grid.runs])
    write_metrics_csv(results, out / "metrics.csv")
    write_summary_csv(results, out / "summary.csv")
    has_curves = any(result.metrics for result in results)
    if has_curves:
        title = f"Eval perplexity vs training step: {options.grid.name}"
        plot_perplexity_curves(results, title, out / "perplexity.png")
    report = Report(options, results, figure="perplexity.png" if has_curves else None)
    if report.cost_figure:
        plot_perplexity_by_cost(results, f"Eval perplexity vs training time and tokens: {options.grid.name}",
                                report.budget, out / report.cost_figure)
    write_text_atomic(out / "report.md", report.markdown())
    write_text_atomic(out / "report.html", report.html())
    return results, out


@dataclass
class Report:
    """The comparison as tables and notes, rendered as markdown or HTML."""

    options: CompareOptions
    results: list[RunResult]
    figure: str | None

    @functools.cached_property
    def timed(self) -> bool:
        """Runs trained to a time budget: steps and tokens are what differ between them."""
        return any(run.get("time_budget") for run in self.run_settings())

    @property
    def budget(self) -> float | None:
        """The time budget (seconds) every run trained to; None for a step budget."""
        return self.run_settings()[0].get("time_budget")

    @property
    def cost_figure(self) -> str | None:
        """A time budget's figure against training time and tokens (runs differ in steps, not in time)."""
        return "perplexity_cost.png" if self.figure and self.budget else None

    def run_settings(self) -> list[dict]:
        """Each run's options as its directory saved them (what it was really trained with), else as they
        would be now."""
        settings = []
        for result in self.results:
            saved = self.options.run_path(result.spec, 0) / OPTIONS_FILE
            settings.append(json.loads(saved.read_text()) if saved.is_file()
                            else run_options(self.options, result.spec, 0).to_json())
        return settings

    def settings(self) -> list[tuple[str, str]]:
        runs = self.run_settings()
        first = runs[0]
        shared_model = {k: v for k, v in first["model"].items() if all(run["model"].get(k) == v for run in runs)}
        if first["dataset"]:
            corpus = f"{first['dataset']} ({first['dataset_config'] or 'default config'})"
        else:
            corpus = ", ".join(first["train_files"]) or "the embedded default corpus"
        budget = first.get("time_budget")
        warmup = (f"{first['warmup']:.0%} of the {'budget' if budget else 'steps'}" if first["warmup"] < 1
                  else f"{first['warmup']:g} step(s)")
        clock = self.clock
        length = (f"{format_duration(budget)} of training {CLOCK_WORDS[clock]} ({CLOCK_EXPLAINED[clock]}; evaluation "
                  "not counted)" if budget else f"{first['max_steps']:,} steps")
        given = Path(first["tokenizer"]) != (self.options.output_dir / "tokenizer").resolve()
        # the vocabulary built, as the first run's model has it (--vocab-size is what was asked: at most that)
        model = read_json(self.options.run_path(self.results[0].spec, 0) / "config.json") or {}
        pieces = model.get("vocab_size", first["vocab_size"])
        tokenizer = first["tokenizer"] + (" (given; shared by all runs)" if given else
                                          f" (unigram, {pieces:,} pieces, trained once on the train "
                                          "text; shared by all runs)")
        return [
            ("recipe", f"{self.options.recipe_name} ({first['objective']}, {first['format']} format)"),
            ("config fields set for every run", json.dumps(shared_model) if shared_model else "none"),
            ("budget (every run)", f"{length} x batch {first['batch_size']} x "
                                   f"{first['seq_len'] or 'max-length'} tokens; lr {first['learning_rate']:g}, "
                                   f"warmup {warmup}, weight decay {first['weight_decay']:g}"),
            ("evaluation", (f"{EVALUATIONS} times over the budget" if budget else
                            f"every {min(first['eval_every'], first['max_steps']):,} steps") + " on "
                           + (f"the first {first['eval_samples']:,} eval examples" if first["eval_samples"]
                              else "all eval examples")),
            ("train text", corpus),
            ("eval text", (", ".join(first["eval_files"]) or "the corpus' own held-out split") + self.eval_overlap()),
            ("tokenizer", tokenizer),
            ("seeds", f"{self.options.seeds} per run (seed k: initialisation, data order and masking; the same k "
                      "gives every run the same data order)"),
            *self.machine(),
        ]

    def machine(self) -> list[tuple[str, str]]:
        """What the runs trained on, from their environment.jsonl: one setting for all, or the first run's and
        every start (a run, a seed, a resume) whose settings moved from it, and every start whose code did;
        nothing for runs older than the record."""
        starts = [(result.spec.name, seed, entry) for result in self.results for seed in sorted(result.metrics)
                  for entry in recorded_environments(self.options.run_path(result.spec, seed))]
        if not starts:
            return []
        first = starts[0][2]
        moved = [f"{name} seed {seed} from step {entry.get('step', 0):,}: {', '.join(what)}"
                 for name, seed, entry in starts if (what := changes(first, entry))]
        recoded = [f"{name} seed {seed} from step {entry.get('step', 0):,}" for name, seed, entry in starts
                   if code_change(first, entry)]
        code = [("code", f"convattn's code differed between starts (its digest in environment.jsonl): "
                         f"{'; '.join(recoded)} ran other code than {starts[0][0]} seed {starts[0][1]}'s first start; "
                         "their numbers compare only where the change computed nothing they report")] if recoded else []
        if not moved:
            return [("machine", f"{describe(first, load=False)} (every run, seed and resume)"), *code]
        return [("machine", f"{describe(first, load=False)}; other settings in {'; '.join(moved)}: tokens/s and "
                            "times compare only between starts of one setting"), *code]

    def eval_overlap(self) -> str:
        """' (eval text is training text ...)' where a run scored on training text, as --allow-eval-overlap let it
        (its data record says how much); '' otherwise."""
        record = read_json(self.options.run_path(self.results[0].spec, 0) / DATA_FILE) or {}
        return f" ({record['eval_overlap']})" if isinstance(record.get("eval_overlap"), str) else ""

    def columns(self) -> list[str]:
        columns = ["Run"]
        if any(result.spec.name != result.spec.preset or result.spec.model for result in self.results):
            columns.append("Preset (+ run fields)")
        columns += ["Encoder params", "Tokens/s", "Train memory (MiB)"]
        if self.timed:
            columns += ["Steps reached", "Tokens seen"]
        if any(result.step_seconds for result in self.results):
            columns += ["Step time (s): median [p10, p90]", "Slowed steps"]
        if any(result.cuda_peak for result in self.results):
            columns.append("GPU peak (MiB)")
        columns += ["Eval perplexity (mean ± std)", "Seeds done"]
        return columns + downstream_columns(self.results)

    def rows(self) -> list[list[str]]:
        winner = clear_winner([r.final_perplexity for r in self.results])
        columns, rows = self.columns(), []
        for index, result in enumerate(self.results):
            estimate = (result.memory or {}).get("estimate", {})
            cells = {
                "Run": result.spec.name,
                "Preset (+ run fields)": result.spec.preset + (f" {json.dumps(result.spec.model)}"
                                                               if result.spec.model else ""),
                "Encoder params": count(estimate.get("encoder_parameters")),
                "Tokens/s": number(result.tokens_per_second, 0),
                "Steps reached": number(result.steps_reached, 0),
                "Tokens seen": number(result.tokens_seen, 0),
                "Step time (s): median [p10, p90]": step_spread(result.step_seconds),
                "Slowed steps": slowed(result.slowed_steps),
                "Train memory (MiB)": number(estimate.get("total_bytes") and estimate["total_bytes"] / MIB),
                "GPU peak (MiB)": number(result.cuda_peak and result.cuda_peak / MIB),
                "Eval perplexity (mean ± std)": mean_std(result.final_perplexity, 2),
                "Seeds done": f"{len(result.finished)}/{self.options.seeds}",
            }
            if index == winner:
                cells["Eval perplexity (mean ± std)"] = f"**{cells['Eval perplexity (mean ± std)']}**"
            for column in downstream_columns(self.results):
                cells[column] = mean_std(result.downstream_score(column), 1)
            rows.append([cells[column] for column in columns])
        return rows

    def seed_rows(self) -> tuple[list[str], list[list[str]]]:
        header = ["Run", *(f"seed {seed}" for seed in range(self.options.seeds))]
        rows = []
        for result in self.results:
            cells = [result.spec.name]
            for seed in range(self.options.seeds):
                rows_of_seed = result.metrics.get(seed)
                if not rows_of_seed:
                    cells.append("–")
                else:
                    last = rows_of_seed[-1]
                    done = "" if seed in result.finished else f" (step {last['step']}, unfinished)"
                    cells.append(f"{last['perplexity']:,.2f}{done}")
            rows.append(cells)
        return header, rows

    def notes(self) -> list[str]:
        notes = [
            "Eval perplexity: exp(mean masked-token loss) on the held-out text at the last step, mean ± sample "
            "standard deviation over the finished pretraining seeds (summary.csv also gives the SEM and each "
            "seed's value). Bold: a run whose mean ± std lies wholly below every other run's (none when they overlap).",
            "Tokens/s: training throughput (non-padding tokens per second, evaluation and checkpoint time left "
            "out), the median over each seed's logging intervals before an evaluation, then the mean over seeds. "
            "Runs are timed one after another on the same machine; other load on it shows up here.",
            "Train memory: fp32 weights, gradients and AdamW moments (16 bytes per parameter) plus the tensors "
            "autograd saves for backward in the forward pass of one training micro-batch (batch x sequence "
            "length), counted once per storage. Measured the same way on every device, it leaves out allocator "
            "overhead and transient buffers: a lower bound that ranks the models, not a process peak.",
            "Encoder params: the encoder without the pretraining head (the tokenizer's vocabulary sets the "
            "embedding size).",
        ]
        if any(result.step_seconds for result in self.results):
            notes.append("Step time: the wall time of one training step, the median of each evaluation interval's "
                         "median over seeds, with the lowest 10th and highest 90th percentile. Slowed steps: the share "
                         "of training steps whose threads spent more than "
                         f"{SLOWED_SHARE:.0%} of their time waiting for a CPU that other processes held (Linux's "
                         "scheduler statistics; – where the system does not say). A row marked 'slowed' shared the "
                         "machine: its tokens/s and step times are not the model's own"
                         + (", nor, on the wall clock, its steps reached; the compute clock does not count the wait."
                            if self.timed else "."))
        if any(result.cuda_peak for result in self.results):
            notes.append("GPU peak: torch.cuda.max_memory_allocated over the training of a run (the highest of its "
                         "seeds trained in one process), mixed precision included.")
        if any(column.startswith("GLUE") for column in downstream_columns(self.results)):
            request = self.options.glue
            seeds = request.seeds if request else "the"
            notes.append(f"GLUE: dev score x 100 of each final model (`convattn glue`), the mean over {seeds} "
                         "fine-tuning seed(s) per pretraining seed, then mean ± std over pretraining seeds.")
        if any(column.startswith("SQuAD") for column in downstream_columns(self.results)):
            request = self.options.squad
            seeds = request.seeds if request else "the"
            notes.append(f"SQuAD: dev exact match and F1 x 100 of each final model (`convattn squad`, the official "
                         f"evaluation; v2.0 at the dev-chosen no-answer threshold), the mean over {seeds} fine-tuning "
                         "seed(s) per pretraining seed, then mean ± std over pretraining seeds.")
        return notes

    def title(self) -> str:
        return f"Comparison: {self.options.grid.name}"

    def markdown(self) -> str:
        lines = [f"# {self.title()}", ""]
        if self.options.grid.description:
            lines += [self.options.grid.description.strip(), ""]
        lines += ["## Settings", ""] + [f"- **{name}**: {value}" for name, value in self.settings()] + [""]
        lines += ["## Results", "", *markdown_table(self.columns(), self.rows()), ""]
        lines += [f"- {note}" for note in self.notes()] + [""]
        if self.figure:
            lines += ["## Eval perplexity vs training step", "",
                      f"![eval perplexity vs training step]({self.figure})", "",
                      CURVES_NOTE, ""]
        if self.cost_figure:
            lines += ["## Eval perplexity vs training time and tokens", "",
                      f"![eval perplexity vs training time and tokens]({self.cost_figure})", "", COST_NOTE, ""]
        header, rows = self.seed_rows()
        lines += ["## Final eval perplexity per seed", "", *markdown_table(header, rows), ""]
        lines += ["Raw numbers: `metrics.csv` (one row per run, seed and evaluation), `summary.csv` (one row per "
                  "run); each run's own output is in `runs/<run>/seed<k>/`.", ""]
        return "\n".join(lines)

    def html(self) -> str:
        from html import escape

        def table(header: list[str], rows: list[list[str]]) -> str:
            head = "".join(f"<th>{escape(cell)}</th>" for cell in header)
            left = [column in TEXT_COLUMNS for column in header]
            body = "".join("<tr>" + "".join(f'<td{" class=text" if text else ""}>{html_cell(cell)}</td>'
                                            for cell, text in zip(row, left, strict=True)) + "</tr>" for row in rows)
            return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

        header, rows = self.seed_rows()
        parts = [
            "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{escape(self.title())}</title>",
            "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}"
            "table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:.3em .6em}"
            "td{text-align:right}td.text{text-align:left}th{background:#f3f3f3}"
            "li{margin:.3em 0}</style></head><body>",
            f"<h1>{escape(self.title())}</h1>",
        ]
        if self.options.grid.description:
            parts.append(f"<p>{escape(self.options.grid.description.strip())}</p>")
        parts.append("<h2>Settings</h2><ul>" + "".join(f"<li><b>{escape(name)}</b>: {escape(value)}</li>"
                                                         for name, value in self.settings()) + "</ul>")
        parts += ["<h2>Results</h2>", table(self.columns(), self.rows()),
                  "<ul>" + "".join(f"<li>{escape(note)}</li>" for note in self.notes()) + "</ul>"]
        if self.figure:
            parts += ["<h2>Eval perplexity vs training step</h2>",
                      f'<img src="{escape(self.figure)}" alt="eval perplexity vs training step" '
                      'style="max-width:100%">',
                      f"<p>{escape(CURVES_NOTE)}</p>"]
        if self.cost_figure:
            parts += ["<h2>Eval perplexity vs training time and tokens</h2>",
                      f'<img src="{escape(self.cost_figure)}" alt="eval perplexity vs training time and tokens" '
                      'style="max-width:100%">', f"<p>{escape(COST_NOTE)}</p>"]
        parts += ["<h2>Final eval perplexity per seed</h2>", table(header, rows),
                  "<p>Raw numbers: <code>metrics.csv</code>, <code>summary.csv</code>; each run's own output is in "
                  "<code>runs/&lt;run&gt;/seed&lt;k&gt;/</code>.</p>", "</body></html>"]
        return "\n".join(parts) + "\n"

    def summary_lines(self) -> list[str]:
        """A short plain-text table for the terminal."""
        header = ["run", "params", "tok/s", "mem MiB", "eval ppl (mean ± std)", "seeds"]
        rows = [[r.spec.name, count(r.memory and r.memory["estimate"]["encoder_parameters"]),
                 number(r.tokens_per_second, 0),
                 number(r.memory and r.memory["estimate"]["total_bytes"] / MIB),
                 mean_std(r.final_perplexity, 2), f"{len(r.finished)}/{self.options.seeds}"]
                for r in self.results]
        if self.timed:
            header.insert(3, "steps")
            for row, result in zip(rows, self.results, strict=True):
                row.insert(3, number(result.steps_reached, 0))
        columns = downstream_columns(self.results)
        header += columns
        for row, result in zip(rows, self.results, strict=True):
            row += [mean_std(result.downstream_score(column), 1) for column in columns]
        widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
        lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                 for row in [header, *rows]]
        shared = [f"{r.spec.name} ({r.slowed_steps:.0%} of steps)" for r in self.results
                  if r.slowed_steps is not None and r.slowed_steps > SLOWED_ROW]
        if shared:
            lines.append(f"slowed by other processes: {', '.join(shared)}: their tok/s are not the models' own"
                         + ("" if self.timed and self.clock == "compute" else
                            "; compare them again on a quiet machine"))
        return lines

    @property
    def clock(self) -> str:
        """The clock a time budget counted (every run's)."""
        return self.run_settings()[0].get("budget_clock") or LEGACY_CLOCK
