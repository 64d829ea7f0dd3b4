"""The package's floors: a module imports only from its own floor or below (read from the source, not run)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "convattn"
COMMAND_HELPERS = ("convattn.commands.arguments", "convattn.commands.pretrain_flags", "convattn.commands.compare_flags",
                   "convattn.commands.fine_tune_flags", "convattn.commands.training_process")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """The convattn modules (or packages) `path` imports, at any depth of its code."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("convattn"):
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("convattn"))
    return names


MODULES = {module_name(path): imported(path) for path in sorted(PACKAGE.rglob("*.py"))}


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not under(m, "convattn.training")
                                          and not under(m, "convattn.commands")
                                          and m not in ("convattn.cli", "convattn.__main__")))
def test_the_library_floor_imports_nothing_from_training_or_the_command_line(module):
    above = sorted(n for n in MODULES[module] if under(n, "convattn.training") or under(n, "convattn.commands")
                   or n == "convattn.cli")
    assert not above, f"{module} imports {above}"


@pytest.mark.parametrize(("task", "other"), [("glue", "squad"), ("squad", "glue")])
def test_fine_tuning_tasks_share_only_finetune(task, other):
    leaning = {m: sorted(n for n in names if under(n, f"convattn.training.{other}"))
               for m, names in MODULES.items() if under(m, f"convattn.training.{task}")}
    assert not any(leaning.values()), leaning


def test_no_command_imports_another_command():
    commands = [m for m in MODULES if under(m, "convattn.commands") and m not in (*COMMAND_HELPERS,
                                                                                  "convattn.commands")]
    for module in commands:
        others = sorted(n for n in MODULES[module] if n in commands and n != module)
        assert not others, f"{module} imports {others}"
