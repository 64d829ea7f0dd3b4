"""`convattn.runs` is the one place that knows a run folder's layout: the file names are spelled only there, it
stands on the ground floor, and a pretraining run's state has one definition."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from convattn.runs.folder import LOCK_FILE
from convattn.runs.pretrain import (
    EMPTY,
    FINISHED,
    IN_PROGRESS,
    NOT_A_RUN,
    OPTIONS_FILE,
    TRAINER_STATE,
    UNSTARTED,
    recorded_options,
    run_state,
)

SOURCE = Path(__file__).resolve().parents[2] / "src" / "convattn"
RUNS = SOURCE / "runs"
LAYOUT_NAMES = ("pretrain_options.json", "metrics.jsonl", "trainer_state.json", "checkpoints")
GROUND_FLOOR = ("convattn.files", "convattn.console", "convattn.errors", "convattn.denormals")


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose, not a file name the code uses)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spells_a_layout_name(text: str) -> bool:
    """A string that is a path naming one of LAYOUT_NAMES (`"checkpoints"`, `"checkpoints/*"`, `"/metrics.jsonl"`),
    or that names a file of them anywhere (prose may say "checkpoints", not "metrics.jsonl")."""
    for name in LAYOUT_NAMES:
        if "." in name and name in text:
            return True
        if re.fullmatch(rf"[\w.*/-]*(^|/){re.escape(name)}(/[\w.*/-]*)?", text):
            return True
    return False


def test_the_layout_names_are_spelled_only_in_the_runs_package():
    spelled = []
    for path in sorted(SOURCE.rglob("*.py")):
        if path.is_relative_to(RUNS):
            continue
        tree = ast.parse(path.read_text())
        prose = docstrings(tree)
        spelled += [f"{path.relative_to(SOURCE)}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
                    and spells_a_layout_name(node.value)]
    assert not spelled, spelled


def test_the_check_sees_each_way_of_spelling_a_name():
    for text in ("checkpoints", "checkpoints/*", "/checkpoints", "run/metrics.jsonl", "trainer_state.json is bad"):
        assert spells_a_layout_name(text), text
    assert not spells_a_layout_name("evaluation and checkpoints not counted")


def test_the_runs_package_stands_on_the_ground_floor():
    for path in RUNS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("convattn"):
                assert node.module in GROUND_FLOOR or node.module.startswith("convattn.runs"), \
                    f"{path.name} imports {node.module}"
            elif isinstance(node, ast.Import):
                assert not any(alias.name.startswith("convattn") for alias in node.names), path.name


def checkpoint(out: Path, step: int, complete: bool = True) -> None:
    folder = out / "checkpoints" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if complete:
        (folder / TRAINER_STATE).write_text("{}")


@pytest.mark.parametrize(("files", "state"), [
    ((), EMPTY),
    ((LOCK_FILE,), EMPTY),
    ((OPTIONS_FILE,), UNSTARTED),
    ((OPTIONS_FILE, "incomplete-checkpoint"), UNSTARTED),
    ((OPTIONS_FILE, "checkpoint"), IN_PROGRESS),
    ((OPTIONS_FILE, "checkpoint", "model.safetensors"), FINISHED),
    (("notes.txt",), NOT_A_RUN),
])
def test_a_pretraining_run_is_in_one_state(tmp_path, files, state):
    out = tmp_path / "run"
    out.mkdir()
    for name in files:
        if name == "checkpoint":
            checkpoint(out, 2)
        elif name == "incomplete-checkpoint":
            checkpoint(out, 4, complete=False)
        else:
            (out / name).write_text("x")
    assert run_state(out) == state
    assert run_state(tmp_path / "missing") == EMPTY


@pytest.mark.parametrize(("saved", "read"), [
    # before the options said null: a time-budget run that no step count ends held the step maximum
    ({"time_budget": 60.0, "max_steps": 1_000_000_000}, {"max_steps": None, "budget_clock": "wall"}),
    # before the budget had a choice of clock it counted the wall's time; a run without a budget says compute
    ({"time_budget": 60.0, "max_steps": 500}, {"max_steps": 500, "budget_clock": "wall"}),
    ({"time_budget": None, "max_steps": 1_000_000_000}, {"max_steps": 1_000_000_000, "budget_clock": "compute"}),
    ({"time_budget": 60.0, "max_steps": None, "budget_clock": "compute"}, {"max_steps": None,
                                                                          "budget_clock": "compute"}),
])
def test_options_recorded_by_earlier_versions_read_as_this_version_writes_them(tmp_path, saved, read):
    file = tmp_path / OPTIONS_FILE
    file.write_text(json.dumps(saved))
    assert recorded_options(file) == {**saved, **read}
