"""Recipes follow the budget the user gives: warmup scaling, refusal of warmup >= steps, no false winners."""

import argparse
import dataclasses

import pytest

from convattn.cli import main
from convattn.commands.arguments import RECIPE_FLAGS
from convattn.commands.pretrain import options_from_args
from convattn.presets import preset_names
from convattn.training.compare.cells import clear_winner
from convattn.training.recipes import (
    Recipe,
    apply_overrides,
    load_recipe,
    recipe_for_preset,
    resolve_recipe,
    shortened_grids,
    warmup_steps,
)

# SPEC: what each paper's pretraining states (chang2021-base: the row its recipe file cites, Chang et al. Table 4)
PAPERS = {
    "chang2021-small": dict(objective="mlm", format="pairs", vocab_size=30004, seq_len=128, batch_size=128,
                            learning_rate=3e-4, warmup=10000, max_steps=125000, weight_decay=0.01),
    "chang2021-base": dict(objective="mlm", format="pairs", vocab_size=30004, seq_len=128, batch_size=256,
                           learning_rate=1e-4, warmup=10000, max_steps=1_000_000, weight_decay=0.01),
    "convbert-small": dict(objective="electra", seq_len=128, batch_size=128, learning_rate=3e-4, warmup=10000,
                           weight_decay=0.01),
    "convbert-base": dict(objective="electra", seq_len=128, batch_size=256, learning_rate=2e-4, warmup=10000,
                          weight_decay=0.01),
    "malard": dict(objective="mlm", format="packed", learning_rate=5e-5, warmup=0.1, weight_decay=0.001),
}


@pytest.mark.parametrize("name", PAPERS)
def test_every_paper_recipe_holds_its_papers_settings(name):
    """The recipe files set what differs between the papers; what they share comes from `Recipe`'s defaults (AdamW
    eps 1e-6 and betas 0.9 / 0.999, clipping at 1.0, 15 % of the tokens masked, one step a batch), so a changed
    default would change every paper run with no file showing it."""
    recipe = load_recipe(name)
    assert {key: getattr(recipe, key) for key in PAPERS[name]} == PAPERS[name]
    shared = (recipe.adam_epsilon, recipe.adam_beta1, recipe.adam_beta2, recipe.max_grad_norm, recipe.mlm_probability,
              recipe.gradient_accumulation)
    assert shared == (1e-6, 0.9, 0.999, 1.0, 0.15, 1)


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_takes_its_papers_recipe(preset):
    """A preset left to its default recipe trains with its paper's settings (a Malard preset on the quick run's
    lr 1e-3 and batch 32 would still run, with other numbers)."""
    family, _, row = preset.partition("/")
    expected = {"convbert": "convbert-base" if row == "base" else "convbert-small"}.get(family, family)
    assert recipe_for_preset(preset) == expected
    assert recipe_for_preset(None) == "default"


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


def test_a_fraction_of_warmup_is_rounded_to_the_nearest_step():
    """6 % of 110 steps is 6.6: 7 warmup steps, not 6 (and 6 % of 105, 6.3, is 6)."""
    default = load_recipe("default")
    assert default.warmup == 0.06
    assert warmup_steps(dataclasses.replace(default, max_steps=110)) == 7
    assert warmup_steps(dataclasses.replace(default, max_steps=105)) == 6


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


def test_a_shortened_paper_run_evaluates_and_saves_at_most_ten_times():
    """Whatever the run's length: 99 steps evaluate every 10 (9 times), not every 9 (11 times)."""
    paper = load_recipe("chang2021-small")
    for steps in range(1, 3000):
        recipe, _ = shortened_grids(paper, dataclasses.replace(paper, max_steps=steps), {"max_steps": steps})
        assert steps // recipe.eval_every <= 10 and steps // recipe.save_every <= 10, steps
        assert recipe.eval_every >= 1 and recipe.save_every >= 1
    recipe, _ = shortened_grids(paper, dataclasses.replace(paper, max_steps=99), {"max_steps": 99})
    assert (recipe.eval_every, recipe.save_every) == (10, 10)


def test_a_grid_coarser_than_ten_a_run_keeps_its_share_of_a_shortened_run():
    """A recipe evaluating 2.5 times a run (every 50,000 of 125,000 steps) still does in a run of 300 steps
    (every 120), instead of the 10 times of a finer recipe's."""
    paper = Recipe("chang2021-small/composite", max_steps=125000, eval_every=50000, save_every=25000)
    recipe, note = shortened_grids(paper, dataclasses.replace(paper, max_steps=300), {"max_steps": 300})
    assert (recipe.eval_every, recipe.save_every) == (120, 60)
    assert "evaluation every 120 and checkpoint every 60 steps" in note


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
