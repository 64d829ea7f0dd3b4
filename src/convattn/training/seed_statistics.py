"""Statistics over seeds, as the results tables report them: mean, standard deviation and standard error."""

from __future__ import annotations

import math
import statistics


def mean_sem(values: list[float]) -> dict | None:
    """Mean, sample standard deviation and standard error of the mean (std and sem are None for one value)."""
    if not values:
        return None
    std = statistics.stdev(values) if len(values) > 1 else None
    sem = std / math.sqrt(len(values)) if std is not None else None
    return {"mean": statistics.fmean(values), "std": std, "sem": sem, "n": len(values), "values": list(values)}


def format_mean_sem(stat: dict | None, digits: int = 1, spread: str = "sem", thousands: bool = False) -> str:
    """'mean ± spread' (spread: 'sem' or 'std'), the mean alone for one seed, '–' for nothing."""
    if stat is None:
        return "–"
    number = f"{{:{',' if thousands else ''}.{digits}f}}"
    if stat[spread] is None:
        return number.format(stat["mean"])
    return f"{number.format(stat['mean'])} ± {number.format(stat[spread])}"
