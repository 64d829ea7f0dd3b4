"""Recipes follow the budget the user gives: warmup scaling, refusal of warmup >= steps, no false winners."""

import argparse

import pytest

from convattn.cli import main
from convattn.commands.arguments import RECIPE_FLAGS
from convattn.commands.pretrain import options_from_args
from convattn.training.compare.cells import clear_winner
from convattn.training.recipes import apply_overrides, load_recipe, resolve_recipe, warmup_steps


def test_paper_warmup_keeps_its_share_of_a_shorter_run():
    recipe = load_recipe("chang2021-small")
    assert (recipe.warmup, recipe.max_steps) == (10000, 125000)
    recipe, note = apply_overrides(recipe, {"max_steps": 300})
    assert recipe.warmup == 24 and warmup_steps(recipe) == 24  # 8 % of the run, as in the paper
    assert "24 steps" in note and "10,000 of 125,000" in note


def test_given_warmup_and_fractions_are_kept():
    recipe = load_recipe("chang2021-small")
    recipe, note = apply_overrides(recipe, {"max_steps": 300, "warmup": 50})
    assert note is None and recipe.warmup == 50
    default, note = apply_overrides(load_recipe("default"), {"max_steps": 100})
    assert note is None and warmup_steps(default) == 6


def parsed(*argv: str) -> argparse.Namespace:
    from convattn.cli import build_parser

    return build_parser().parse_args(["pretrain", *argv])


def test_command_line_scales_and_says_so(capsys):
    options = options_from_args(parsed("--preset", "chang2021-small/composite", "--max-steps", "300"))
    assert options.recipe.warmup == 24
    assert "warmup scaled to 24 steps" in capsys.readouterr().err
    assert "warmup" in RECIPE_FLAGS


def test_a_shortened_paper_run_scales_its_evaluation_and_checkpoint_grid():
    recipe, note = resolve_recipe("chang2021-small/composite", training={"max_steps": 300})
    assert (recipe.eval_every, recipe.save_every) == (30, 30)  # 5,000 of 125,000 is 12 of 300: 10 times a run at most
    assert "evaluation every 30 and checkpoint every 30 steps" in note
    long, _ = resolve_recipe("convbert/small", training={"max_steps": 200_000})
    assert (long.eval_every, long.save_every) == (10000, 10000)  # 20 times a run: the recipe's own grid is finer
    quick, note = resolve_recipe(None, training={"max_steps": 100})  # the quick run's recipe is a quick run's
    assert (quick.eval_every, quick.save_every, note) == (50, 100, None)


def test_a_given_grid_a_full_run_and_a_time_budget_keep_theirs():
    given, note = resolve_recipe("chang2021-small/composite", training={"max_steps": 300, "eval_every": 7})
    assert (given.eval_every, given.save_every) == (7, 30) and "checkpoint every 30 steps" in note
    full, note = resolve_recipe("chang2021-small/composite")
    assert (full.eval_every, full.save_every, note) == (5000, 5000, None)
    budget, note = resolve_recipe("chang2021-small/composite", training={"time_budget": 60.0})
    assert (budget.eval_every, budget.save_every) == (5000, 5000) and "checkpoint" not in note


def test_a_run_of_its_own_length_says_which_recipe_values_apply(capsys):
    options_from_args(parsed("--preset", "chang2021-small/composite", "--max-steps", "300", "--batch-size", "16"))
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "recipe chang2021-small:" in line)
    assert "vocabulary 30,004" in line and "sequence length 128" in line
    assert "batch" not in line.split("(give")[0] and "--vocab-size" in line  # what was given is not listed
    _, note = resolve_recipe("chang2021-small/composite", training={"max_steps": 300})
    assert note.startswith("recipe chang2021-small: batch 128, vocabulary 30,004")


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
