"""Statistics over seeds, as the results tables report them."""

import pytest

from convattn.training.seed_statistics import format_mean_sem, mean_sem


def test_mean_sem_and_its_cell():
    stat = mean_sem([1.0, 2.0, 3.0, 6.0])
    assert stat["mean"] == 3.0 and stat["std"] == pytest.approx(2.1602469) and stat["sem"] == pytest.approx(1.0801234)
    assert format_mean_sem(stat) == "3.0 ± 1.1" and format_mean_sem(stat, 2, spread="std") == "3.00 ± 2.16"
    assert format_mean_sem(mean_sem([1234.5]), thousands=True) == "1,234.5" and format_mean_sem(None) == "–"
