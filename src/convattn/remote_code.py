"""Modeling code saved beside a model, so that `trust_remote_code=True` loads it without convattn: one file.

transformers' dynamic-module loader copies the file that `config.json`'s `auto_map` names and, recursively, the
files it imports as `from .name import ...` (a regular expression over its text), all into one flat folder; every
other import must be an installed package. So the modules the model needs (found by following their imports, not
listed by hand) are written into ONE file, `convattn_modeling.py`: each module's source is a string in it (on one
line, so that the loader's expression reads none of their imports), their `convattn.*` imports made relative, and
the file imports them from memory as its own submodules (`<file's module>.model`, `.attention.core`, ...), package
by package as convattn lays them out. Every entry point of `auto_map` is a name of that file, so a model loaded
with any Auto class saves the same file again, and a re-save copies it as it is.

Only a model folder needs it: a checkpoint (`checkpoints/checkpoint-N`) is resumed by convattn itself and saved
without it (`without_remote_code`). Only the standard library is imported here: this module is bundled too.
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
BUNDLE = "convattn_modeling"  # the file's stem: auto_map's module
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
_skipped = [False]  # inside `without_remote_code`


def auto_map() -> dict[str, str]:
    return {auto: f"{BUNDLE}.{cls}" for auto, (_, cls) in AUTO_MAP.items()}


@contextmanager
def without_remote_code() -> Iterator[None]:
    """Models saved inside get neither the bundle nor an `auto_map` (checkpoints: convattn resumes them)."""
    _skipped[0] = True
    try:
        yield
    finally:
        _skipped[0] = False


def wanted() -> bool:
    """Whether a model saved now gets its modeling code (not inside `without_remote_code`)."""
    return not _skipped[0]


def _module_file(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _is_package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


def _ours(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _key(module: str) -> str:
    """`convattn.attention.core` -> `attention.core`: the module's name under the bundle."""
    return module.removeprefix(PACKAGE).removeprefix(".")


def _absolute(node: ast.ImportFrom, module: str) -> str:
    if not node.level:
        return node.module
    package = module if _is_package(module) else module.rpartition(".")[0]
    return importlib.util.resolve_name("." * node.level + (node.module or ""), package)


def _imports(node: ast.stmt, module: str) -> tuple[list[str] | None, list[str]]:
    """(the statement's lines with its convattn imports relative, or None to keep it; the convattn modules it
    imports). `import convattn.x.y as z` becomes `from <dots>x import y as z`; without `as` only its side effect is
    kept (it binds `convattn`, which the bundle has not)."""
    package = module if _is_package(module) else module.rpartition(".")[0]
    dots = "." * (package.count(".") + 1)  # from the module's package up to convattn's root (the bundle)
    needed: list[str] = []
    if isinstance(node, ast.Import):
        if not any(_ours(a.name) for a in node.names):
            return None, needed
        lines = []
        for a in node.names:
            if not _ours(a.name):
                lines.append(f"import {a.name}" + (f" as {a.asname}" if a.asname else ""))
                continue
            if a.name != PACKAGE:  # `import convattn` alone: the root, which is the bundle itself
                needed.append(a.name)
            parent, _, name = _key(a.name).rpartition(".")
            if name:
                lines.append(f"from {dots}{parent} import {name} as {a.asname or '_'}")
        return lines or ["pass"], needed
    if isinstance(node, ast.ImportFrom):
        source = _absolute(node, module)
        if not _ours(source):
            return None, needed
        for a in node.names:
            submodule = f"{source}.{a.name}"
            is_submodule = a.name != "*" and _is_package(source) and importlib.util.find_spec(submodule) is not None
            needed.append(submodule if is_submodule else source)
        if node.level:  # relative already: the bundle keeps convattn's layout
            return None, needed
        names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
        return [f"from {dots}{_key(source)} import {names}"], needed
    return None, needed


def bundle_sources(entry_modules: list[str]) -> dict[str, str]:
    """{module name under the bundle ("" never: the bundle is the root): rewritten source} of the entry modules and
    every convattn module they import, each package on their way included (empty where nothing is imported from
    its __init__, which convattn's modules then never need)."""
    sources, pending = {}, list(entry_modules)
    while pending:
        module = pending.pop()
        if _key(module) in sources or module == PACKAGE:
            if module == PACKAGE:
                raise ValueError("the modeling code imports names from convattn's __init__; import them from their "
                                 "modules, so that the bundle (remote_code.py) holds them")
            continue
        path = _module_file(module)
        if path is None:
            raise FileNotFoundError(f"cannot find the source of module {module!r} to save with the model")
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        # bottom-up, so earlier line numbers stay valid while later statements are replaced
        for node in sorted(ast.walk(ast.parse(text)), key=lambda n: getattr(n, "lineno", 0), reverse=True):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            new_lines, needed = _imports(node, module)
            pending.extend(needed)
            if new_lines is None:
                continue
            indent = lines[node.lineno - 1][: node.col_offset]
            tail = lines[node.end_lineno - 1][node.end_col_offset:]
            new_lines = [indent + line for line in new_lines]
            new_lines[-1] += tail
            lines[node.lineno - 1: node.end_lineno] = new_lines
        sources[_key(module)] = "\n".join(lines) + "\n"
    for key in list(sources):  # the packages on the way: convattn runs their __init__ first, so does the bundle
        parts = key.split(".")
        for depth in range(1, len(parts)):
            sources.setdefault(".".join(parts[:depth]), "")
    return sources


def packages(sources: dict[str, str]) -> list[str]:
    """The bundle's keys that are packages (convattn's folders)."""
    return sorted(key for key in sources if _is_package(f"{PACKAGE}.{key}"))


LOADER = '''

class _Modules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports _SOURCES as submodules of this module, with their sources for tracebacks and inspect (Triton)."""

    def __init__(self, root, file):
        self.bundle_root, self.file = root, file

    def _key(self, fullname):
        key = fullname[len(self.bundle_root) + 1:] if fullname.startswith(self.bundle_root + ".") else None
        return key if key in _SOURCES else None

    def find_spec(self, fullname, path=None, target=None):
        key = self._key(fullname)
        if key is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=self.file, is_package=key in _PACKAGES)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        key = self._key(module.__name__)
        module.__file__ = self.file  # what a re-save copies (transformers' custom_object_save)
        path = key.replace(".", "/") + ("/__init__" if key in _PACKAGES else "")
        exec(compile(_SOURCES[key], f"{self.file}/{path}.py", "exec"), module.__dict__)

    def get_source(self, fullname):
        key = self._key(fullname)
        return None if key is None else _SOURCES[key]


def _install():
    """Import this file's modules from memory; an earlier run of this file (reloaded) leaves none of its own."""
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "bundle_root", None) != __name__]
    for name in [name for name in sys.modules if name.startswith(__name__ + ".")]:
        del sys.modules[name]
    sys.meta_path.insert(0, _Modules(__name__, __file__))


__path__ = []  # a package: its modules come from _SOURCES
_install()
'''


def bundle_text(sources: dict[str, str]) -> str:
    """The one file: its modules' sources, the loader, and every class `auto_map` names."""
    lines = ['"""convattn\'s modeling code in one file, so that AutoModel*.from_pretrained(folder, '
             'trust_remote_code=True)',
             "runs it where convattn is not installed. Written by convattn (remote_code.py): each module of convattn "
             "the model",
             'needs is a source string below, imported from memory as a submodule of this module."""',
             "", "import importlib.abc", "import importlib.util", "import sys", "",
             f"_PACKAGES = frozenset({packages(sources)!r})",
             "_SOURCES = {"]
    lines += [f"    {key!r}: {text!r}," for key, text in sorted(sources.items())]
    lines += ["}", LOADER.rstrip("\n"), ""]
    for module, cls in sorted({(_key(module), cls) for module, cls in AUTO_MAP.values()}):
        lines.append(f"{cls} = getattr(importlib.import_module(__name__ + {'.' + module!r}), {cls!r})")
    return "\n".join(lines) + "\n"


def write_remote_code(save_directory: str | os.PathLike, config_module: str) -> None:
    """Write the modeling code into `save_directory`. `config_module` is the config class's module: inside
    convattn the bundle is generated from the package; inside a bundle loaded with trust_remote_code (convattn not
    installed) the bundle file is copied as it is."""
    if _ours(config_module):
        text = bundle_text(bundle_sources(sorted({module for module, _ in AUTO_MAP.values()})))
    else:
        text = Path(sys.modules[config_module].__file__).read_text(encoding="utf-8")
    write_text_atomic(Path(save_directory) / f"{BUNDLE}.py", text)
