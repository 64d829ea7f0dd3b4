"""A run's per-seed eval curves brought onto one grid before they are averaged: seeds of a time-budget comparison
evaluate at different steps (the budget buys each a different number), so the mean and the min-max band of the
perplexity figures are taken over each seed's curve interpolated at the same points."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class SeedBand:
    """The seeds' perplexity at each grid point: their mean and their min-max band."""

    x: list[float]
    mean: list[float]
    low: list[float]
    high: list[float]


def align_seeds(curves: Sequence[Sequence[tuple[float, float]]]) -> SeedBand | None:
    """`curves`: one list of (x, perplexity) points per seed. The grid is every x a seed evaluated at within the
    range all seeds cover; each seed's perplexity there is interpolated linearly in log space (a straight segment
    on the figures' log scale), so it is exact at the seed's own evaluations: where all seeds evaluated at the same
    last x, the last mean is the mean of their final evaluations. None when the seeds share no range."""
    seeds = [_sorted_points(curve) for curve in curves if curve]
    if not seeds:
        return None
    start, end = max(xs[0] for xs, _ in seeds), min(xs[-1] for xs, _ in seeds)
    if start > end:
        return None
    grid = np.unique(np.concatenate([xs[(xs >= start) & (xs <= end)] for xs, _ in seeds]))
    values = np.stack([np.exp(np.interp(grid, xs, np.log(ys))) for xs, ys in seeds])
    return SeedBand(grid.tolist(), values.mean(axis=0).tolist(), values.min(axis=0).tolist(),
                    values.max(axis=0).tolist())


def _sorted_points(curve: Sequence[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The points in increasing x; of points at the same x, the last one given."""
    by_x = dict(curve)
    xs = np.array(sorted(by_x), dtype=float)
    return xs, np.array([by_x[x] for x in sorted(by_x)], dtype=float)
