"""The kernel-size figure (Jiang et al. 2020, Figure 5 style) as drawn: what each panel holds."""

from __future__ import annotations

import statistics

import pytest

import convattn.analysis.kernel_size as module


@pytest.fixture
def figures(drawn):
    return drawn(module)


def test_sizes_without_a_finished_seed_are_left_out_and_one_seed_has_no_error_bar(figures, tmp_path):
    module.plot_kernel_size_sweep([3, 5, 9], [[80.0], [70.0], []], None, "sweep", tmp_path / "k.png")
    (ax,) = figures[0].axes
    (line,) = ax.lines
    assert list(line.get_xdata()) == [3, 5] and list(line.get_ydata()) == [80.0, 70.0]
    assert [len(dots.get_offsets()) for dots in ax.collections] == [1, 1]  # a dot per seed, no bar
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["one seed"]
    assert not [c for c in ax.containers if c.has_yerr]
    assert list(ax.get_xticks()) == [3, 5, 9]


def test_several_seeds_get_their_mean_and_spread_and_glue_its_own_panel(figures, tmp_path):
    perplexities = [[80.0, 84.0], [70.0, 71.0, 75.0]]
    module.plot_kernel_size_sweep([5, 9], perplexities, [[60.0, 62.0], [61.0]], "sweep", tmp_path / "k.png")
    left, right = figures[0].axes
    assert list(left.lines[0].get_ydata()) == [statistics.fmean(v) for v in perplexities]
    (bars,) = [c for c in left.containers if c.has_yerr]
    spans = [segment[1, 1] - segment[0, 1] for segment in bars.lines[2][0].get_segments()]
    assert spans == pytest.approx([2 * statistics.stdev(v) for v in perplexities])
    assert "GLUE" in right.get_ylabel() and list(right.lines[0].get_ydata()) == [61.0, 61.0]
