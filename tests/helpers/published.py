"""What a published model folder (models/<task>/) must not hold."""

from __future__ import annotations

import re
from pathlib import Path

STAGING_FOLDER = re.compile(r"\.[\w.-]+\.\w+\.tmp\b")  # tempfile.mkdtemp(prefix=".sst2.", suffix=".tmp")


def staging_folder_mentions(folder: Path) -> list[str]:
    """'file: name' for every file under `folder` whose text names a temporary staging folder."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".safetensors"):
        found += [f"{path.relative_to(folder)}: {name}"
                  for name in STAGING_FOLDER.findall(path.read_text(encoding="utf-8", errors="replace"))]
    return found
