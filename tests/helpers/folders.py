"""What a failing command must leave as it was: every file of a folder hashed, and its one error line."""

from __future__ import annotations

import hashlib
from pathlib import Path


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under `folder` (nothing when it does not exist): its content hash and modification time."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def entries(folder: Path) -> list[str]:
    """Every file and folder under `folder`, relative to it (nothing when it does not exist)."""
    folder = Path(folder)
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def one_error_line(err: str, command: str, *needles: str) -> str:
    """The command's stderr ends in one error line naming `needles`, and holds no traceback."""
    lines = err.strip().splitlines()
    assert lines, "no error line"
    last = lines[-1]
    assert last.startswith(f"convattn {command}: error: "), err
    assert "Traceback" not in err and "unexpected error" not in err, err
    for needle in needles:
        assert needle in last, (needle, last)
    return last
