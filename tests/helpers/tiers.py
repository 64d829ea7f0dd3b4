"""The fast tier (`pytest -m "not slow"`) keeps a representative few of a parametrized test's cases."""

from __future__ import annotations

import pytest


def slow_except(values, *fast) -> list:
    """`values` for `pytest.mark.parametrize`, each marked slow except those in `fast` (a tuple value stands for
    several argument names). In a product of parametrizations, a case is slow where any of its values is."""
    return [value if value in fast else pytest.param(*(value if isinstance(value, tuple) else (value,)),
                                                      marks=pytest.mark.slow) for value in values]
