"""Recipes follow the budget the user gives: warmup scaling, refusal of warmup >= steps, no false winners."""

import argparse

import pytest

from convattn.cli import main
from convattn.commands.arguments import RECIPE_FLAGS
from convattn.commands.pretrain import options_from_args
from convattn.training.compare.cells import clear_winner
from convattn.training.recipes import apply_overrides, load_recipe, warmup_steps


def test_paper_warmup_keeps_its_share_of_a_shorter_run():
    recipe = load_recipe("chang2021-small")
    assert (recipe.warmup, recipe.max_steps) == (10000, 125000)
    note = apply_overrides(recipe, {"max_steps": 300})
    assert recipe.warmup == 24 and warmup_steps(recipe) == 24  # 8 % of the run, as in the paper
    assert "24 steps" in note and "10,000 of 125,000" in note


def test_given_warmup_and_fractions_are_kept():
    recipe = load_recipe("chang2021-small")
    assert apply_overrides(recipe, {"max_steps": 300, "warmup": 50}) is None and recipe.warmup == 50
    default = load_recipe("default")
    assert apply_overrides(default, {"max_steps": 100}) is None and warmup_steps(default) == 6


def parsed(*argv: str) -> argparse.Namespace:
    from convattn.cli import build_parser

    return build_parser().parse_args(["pretrain", *argv])


def test_command_line_scales_and_says_so(capsys):
    options = options_from_args(parsed("--preset", "chang2021-small/composite", "--max-steps", "300"))
    assert options.recipe.warmup == 24
    assert "warmup scaled to 24 steps" in capsys.readouterr().err
    assert "warmup" in RECIPE_FLAGS


def test_warmup_not_below_max_steps_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["pretrain", "--max-steps", "10", "--warmup", "10", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("convattn pretrain: error: --warmup 10 is not below --max-steps 10") and "\n" not in err
    assert not out.exists()


@pytest.mark.parametrize(("stats", "winner"), [
    ([{"mean": 10.0, "std": 1.0}, {"mean": 20.0, "std": 2.0}], 0),
    ([{"mean": 10.0, "std": 6.0}, {"mean": 20.0, "std": 5.0}], None),  # bands overlap: no winner
    ([{"mean": 10.0, "std": None}, {"mean": 20.0, "std": None}], None),  # one seed each: no spread to judge by
    ([{"mean": 10.0, "std": 1.0}], None),
    ([{"mean": 30.0, "std": 1.0}, None], None),
])
def test_report_bolds_only_a_winner_outside_the_seeds_spread(stats, winner):
    assert clear_winner(stats) == winner
