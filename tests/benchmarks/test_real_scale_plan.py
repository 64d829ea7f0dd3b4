"""benchmarks/real_scale.py run's plan: both models the same training budget, the whole call (unpacking and
tokenizing included) inside its limit, a continuing call keeping the first call's budget."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "real_scale.py"


@pytest.fixture(scope="module")
def real_scale():
    spec = importlib.util.spec_from_file_location("real_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_plan_fits_the_call_with_equal_budgets(real_scale, capsys):
    args = argparse.Namespace(dry_run=True, limit=real_scale.CALL_LIMIT, presets=real_scale.PRESETS)
    assert real_scale.run(args) == 0
    printed = capsys.readouterr().out.splitlines()
    budgets = {line.split()[-2] for line in printed if "training (budget)" in line}
    assert len([line for line in printed if "training (budget)" in line]) == 2 and len(budgets) == 1
    total = next(line for line in printed if "total" in line)
    assert float(total.split()[-2]) <= 540 and real_scale.CALL_LIMIT <= 540
    assert "prepare" in "\n".join(printed) and "unpack" in "\n".join(printed)


def test_the_budget_shrinks_with_the_measured_tokenizing_time_and_the_total_stays_inside(real_scale):
    quick, _ = real_scale.plan_lines(540, {"unpack": 10, "prepare": 30}, 2)
    slow, lines = real_scale.plan_lines(540, {"unpack": 10, "prepare": 150}, 2)
    assert quick - slow == pytest.approx(60)  # 120 s more tokenizing: 60 s less for each model
    assert float(lines[-1].split()[-2]) == pytest.approx(540, abs=1)


def test_a_continuing_call_keeps_the_first_calls_budget(real_scale, tmp_path, capsys):
    args = argparse.Namespace(budget=None, limit=540)
    first = real_scale.budget_for_call(args, tmp_path, {"unpack": 10, "prepare": 60}, 2)
    assert first == "167s" and json.loads((tmp_path / real_scale.PLAN_FILE).read_text())["budget"] == "167s"
    assert real_scale.budget_for_call(args, tmp_path, {"unpack": 1, "prepare": 1}, 2) == "167s"
    assert "continuing the first call's plan" in capsys.readouterr().out


def test_a_call_left_without_time_to_train_refuses(real_scale, tmp_path):
    with pytest.raises(SystemExit, match="s of training each is left"):
        real_scale.budget_for_call(argparse.Namespace(budget=None, limit=540), tmp_path, {"prepare": 400}, 2)
    assert not (tmp_path / real_scale.PLAN_FILE).exists()
