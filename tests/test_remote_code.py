"""The bundle writer on every import form: a package of its own, bundled flat, imports and binds what the source
bound (convattn's modules use only some of these forms today; a new `import convattn.x as y` must not break a
saved model's remote code)."""

from __future__ import annotations

import importlib
import re
import sys
import textwrap
from pathlib import Path

import pytest

from convattn import remote_code

PROBE = "rc_probe"  # the package standing in for convattn

FILES = {
    "__init__.py": "",
    "leaf.py": "VALUE = 7\n\ndef f():\n    return 'leaf'\n",
    "sub/__init__.py": "from .inner import INNER  # a relative import inside a package\n",
    "sub/inner.py": "INNER = 'inner'\n",
    "entry.py": textwrap.dedent(f"""\
        import os, {PROBE}.leaf
        import {PROBE}.leaf as leaf_alias
        from {PROBE} import leaf
        from {PROBE}.sub import INNER
        from .sub import inner  # relative, in a module: the package is its parent
        from {PROBE}.leaf import VALUE; AFTER = VALUE + 1


        def lazy():
            from {PROBE}.leaf import f
            return f()
        """),
}


@pytest.fixture
def probe_bundle(tmp_path, monkeypatch):
    """{file name: source} of the probe package's bundle, and a folder to import it from as package `flat`; the
    probe package itself is no longer importable."""
    for name, text in FILES.items():
        path = tmp_path / "src" / PROBE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setattr(remote_code, "PACKAGE", PROBE)
    importlib.invalidate_caches()
    sources = remote_code.bundle_sources([f"{PROBE}.entry"])
    forget_probe_modules()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path / "src")])  # as where not installed
    yield sources, tmp_path / "flat"
    forget_probe_modules()


def forget_probe_modules() -> None:
    for module in [m for m in sys.modules if m.split(".")[0] in (PROBE, "flat")]:
        del sys.modules[module]


def test_every_import_form_binds_the_same_names_in_the_flat_bundle(probe_bundle, monkeypatch):
    sources, folder = probe_bundle
    assert set(sources) == {f"{PROBE}_{stem}.py" for stem in ("entry", "leaf", "sub", "sub_inner")}
    (folder / "flat").mkdir(parents=True)
    (folder / "flat" / "__init__.py").write_text("")
    for name, text in sources.items():
        assert not re.search(rf"^\s*(import|from) {PROBE}\b", text, re.MULTILINE), name  # all relative now
        (folder / "flat" / name).write_text(text)
    monkeypatch.syspath_prepend(str(folder))
    entry = importlib.import_module(f"flat.{PROBE}_entry")
    leaf = sys.modules[f"flat.{PROBE}_leaf"]
    assert entry.os is importlib.import_module("os")
    assert entry.leaf_alias is leaf and entry.leaf is leaf
    assert entry.INNER == "inner" and entry.inner.INNER == "inner"
    assert entry.AFTER == 8  # what followed the import on its line is kept
    assert entry.lazy() == "leaf"  # an import inside a function keeps its indentation


def test_the_config_file_names_every_other_file_as_transformers_reads_imports(tmp_path):
    """transformers' loader copies the files a module imports relatively; the config's file, read first by every
    load, must name the whole bundle so that any Auto class brings all of it."""
    from transformers.dynamic_module_utils import get_relative_imports

    sources = remote_code.with_every_file_named(remote_code.bundle_sources(
        sorted({module for module, _ in remote_code.AUTO_MAP.values()})))
    config_file = remote_code.flat_name(remote_code.AUTO_MAP["AutoConfig"][0]) + ".py"
    (tmp_path / config_file).write_text(sources[config_file])
    assert set(get_relative_imports(tmp_path / config_file)) == {Path(name).stem for name in sources} - {
        Path(config_file).stem}
