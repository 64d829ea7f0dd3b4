"""Running a script where convattn cannot be imported, as where it is not installed (trust_remote_code)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# a meta-path finder that makes every `convattn` import fail, as in an environment without it installed
BLOCK_CONVATTN = textwrap.dedent('''
    import sys

    class _NoConvattn:
        def find_spec(self, name, path=None, target=None):
            if name == "convattn" or name.startswith("convattn."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, _NoConvattn())
''')


def run_without_convattn(tmp_path, script: str, *args: str) -> subprocess.CompletedProcess:
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCK_CONVATTN)
    (tmp_path / "script.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(blocker), HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    return subprocess.run([sys.executable, str(tmp_path / "script.py"), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
