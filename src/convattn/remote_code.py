"""Modeling code saved next to every checkpoint, so `trust_remote_code=True` loads it without convattn.

transformers' dynamic-module loader copies the file named in `config.json`'s `auto_map` and, recursively,
the files it imports as `from .name import ...`, all into one flat folder; any other import must be an
installed package. So at save time the convattn modules the model needs (found by following its imports,
not listed by hand) are written flat as `convattn_<dotted_name>.py`, their `convattn.*` imports rewritten to
relative ones. The loader copies only what the loaded class needs, so the config's file, which every load reads
first, names every file of the bundle in a block that never runs: a model loaded with one Auto class saves the
whole bundle again, every entry point auto_map lists. Only the standard library is imported here: this module is
bundled too.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from convattn.files import write_text_atomic

PACKAGE = "convattn"
# Auto class -> (module, class) of every entry point, so one checkpoint loads with any head
AUTO_MAP = {
    "AutoConfig": ("convattn.config", "ConvAttnConfig"),
    "AutoModel": ("convattn.model", "ConvAttnModel"),
    "AutoModelForMaskedLM": ("convattn.model", "ConvAttnForMaskedLM"),
    "AutoModelForPreTraining": ("convattn.electra", "ConvAttnForPreTraining"),
    "AutoModelForSequenceClassification": ("convattn.model", "ConvAttnForSequenceClassification"),
    "AutoModelForTokenClassification": ("convattn.model", "ConvAttnForTokenClassification"),
    "AutoModelForQuestionAnswering": ("convattn.model", "ConvAttnForQuestionAnswering"),
}


def flat_name(module: str) -> str:
    """`convattn.attention.core` -> `convattn_attention_core` (the file stem in the saved folder)."""
    return module.replace(".", "_")


_skipped = [False]  # inside `without_remote_code`


@contextmanager
def without_remote_code() -> Iterator[None]:
    """Models saved inside get neither the modeling code nor an `auto_map` (checkpoints: convattn resumes them, and
    a model folder alone needs to load without convattn)."""
    _skipped[0] = True
    try:
        yield
    finally:
        _skipped[0] = False


def wanted() -> bool:
    """Whether a model saved now gets its modeling code (not inside `without_remote_code`)."""
    return not _skipped[0]


def auto_map() -> dict[str, str]:
    return {auto: f"{flat_name(module)}.{cls}" for auto, (module, cls) in AUTO_MAP.items()}


def _module_file(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _is_package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


def _ours(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _absolute(node: ast.ImportFrom, module: str) -> str:
    if not node.level:
        return node.module
    package = module if _is_package(module) else module.rpartition(".")[0]
    return importlib.util.resolve_name("." * node.level + (node.module or ""), package)


def _rewrite(node: ast.stmt, module: str) -> tuple[list[str], list[str]] | None:
    """(new source lines, convattn modules imported) for an import of convattn code, else None.

    A module import becomes `from .file import __name__ as _` (the line transformers follows to copy the
    file) plus `from . import file as alias`; a name import becomes `from .file import name as alias`.
    """
    lines, needed = [], []

    def import_module(target: str, alias: str | None) -> None:
        needed.append(target)
        lines.append(f"from .{flat_name(target)} import __name__ as _  # noqa: F401")
        if alias:
            lines.append(f"from . import {flat_name(target)} as {alias}")

    if isinstance(node, ast.Import):
        if not any(_ours(a.name) for a in node.names):
            return None
        for a in node.names:
            if not _ours(a.name):
                lines.append(f"import {a.name}" + (f" as {a.asname}" if a.asname else ""))
            else:
                # `import convattn.x.y` binds `convattn`, which the bundle has not: only its side effect is kept
                import_module(a.name, a.asname)
        return lines, needed
    if isinstance(node, ast.ImportFrom):
        source = _absolute(node, module)
        if not _ours(source):
            return None
        names = []
        for a in node.names:
            submodule = f"{source}.{a.name}"
            if a.name != "*" and _is_package(source) and importlib.util.find_spec(submodule) is not None:
                import_module(submodule, a.asname or a.name)
            else:
                names.append(a.name + (f" as {a.asname}" if a.asname else ""))
        if names:
            needed.append(source)
            lines.append(f"from .{flat_name(source)} import {', '.join(names)}")
        return lines, needed
    return None


def with_every_file_named(sources: dict[str, str]) -> dict[str, str]:
    """The bundle with the config's file naming the other files as transformers' loader reads imports (a
    regular expression over `from .name import` lines); the block never runs, the imports would be circular."""
    config_file = flat_name(AUTO_MAP["AutoConfig"][0]) + ".py"
    block = ["", "", "", "if False:  # names every file of the bundle, so that the loader copies them all"]
    block += [f"    from .{Path(name).stem} import __name__ as _  # noqa: F401"
              for name in sorted(sources) if name != config_file]
    return sources | {config_file: sources[config_file].rstrip("\n") + "\n".join(block) + "\n"}


def bundle_sources(entry_modules: list[str]) -> dict[str, str]:
    """{file name: rewritten source} of the entry modules and every convattn module they import."""
    sources, pending = {}, list(entry_modules)
    while pending:
        module = pending.pop()
        name = flat_name(module) + ".py"
        if name in sources:
            continue
        path = _module_file(module)
        if path is None:
            raise FileNotFoundError(f"cannot find the source of module {module!r} to save with the model")
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        # bottom-up, so earlier line numbers stay valid while later statements are replaced
        for node in sorted(ast.walk(ast.parse(text)), key=lambda n: getattr(n, "lineno", 0), reverse=True):
            rewritten = _rewrite(node, module) if isinstance(node, ast.Import | ast.ImportFrom) else None
            if rewritten is None:
                continue
            new_lines, needed = rewritten
            pending.extend(needed)
            indent = lines[node.lineno - 1][: node.col_offset]
            tail = lines[node.end_lineno - 1][node.end_col_offset:]
            new_lines = [indent + line for line in new_lines]
            new_lines[-1] += tail
            lines[node.lineno - 1: node.end_lineno] = new_lines
        sources[name] = "\n".join(lines) + "\n"
    return sources


def write_remote_code(save_directory: str | os.PathLike, config_module: str) -> None:
    """Write the modeling code into `save_directory`. `config_module` is the config class's module:
    inside convattn the bundle is generated from the package; inside a bundle loaded with
    trust_remote_code (convattn not installed) the bundle's own files are copied as they are."""
    directory = Path(save_directory)
    if _ours(config_module):
        sources = with_every_file_named(bundle_sources(sorted({module for module, _ in AUTO_MAP.values()})))
    else:
        folder = Path(sys.modules[config_module].__file__).parent
        sources = {p.name: p.read_text(encoding="utf-8") for p in folder.glob(f"{PACKAGE}_*.py")}
    for name, text in sources.items():
        write_text_atomic(directory / name, text)
