"""Table cells of a comparison's report: counts, numbers, mean ± std, the clear winner, markdown and HTML."""

from __future__ import annotations

from convattn.training.seed_statistics import format_mean_sem


def clear_winner(perplexities: list[dict | None]) -> int | None:
    """The run whose perplexity band (mean ± std over seeds) lies wholly below every other run's band; None when
    the bands overlap, a run has a single seed (no spread to judge by) or there is nothing to compare."""
    if len(perplexities) < 2 or any(stat is None or stat["std"] is None for stat in perplexities):
        return None
    best = min(range(len(perplexities)), key=lambda i: perplexities[i]["mean"])
    top = perplexities[best]["mean"] + perplexities[best]["std"]
    others = [stat["mean"] - stat["std"] for i, stat in enumerate(perplexities) if i != best]
    return best if all(top < low for low in others) else None


def count(value: int | None) -> str:
    """A parameter count: 13.09M, 20.4k."""
    if value is None:
        return "–"
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.1f}k"


def number(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def mean_std(stat: dict | None, digits: int) -> str:
    return format_mean_sem(stat, digits, spread="std", thousands=True)


TEXT_COLUMNS = ("Run", "Preset (+ run fields)")  # left-aligned; the other columns hold numbers


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    align = ["---" if column in TEXT_COLUMNS else "---:" for column in header]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def html_cell(text: str) -> str:
    from html import escape

    if text.startswith("**") and text.endswith("**"):
        return f"<strong>{escape(text[2:-2])}</strong>"
    return escape(text)
