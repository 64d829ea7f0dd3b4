"""Writing files so that a crash, a kill or a full disk never leaves half a file under the final name.

Each write goes to a uniquely named temporary file beside the target, which is renamed over the target only
once complete; on any failure the temporary file is removed. The result has the permissions an ordinary
`open(path, "w")` would give (0666 less the umask), not the 0600 of a private temporary file, so a model card or
the modeling code of a shared model stays readable by others.

Also here, as they are about files: figures (`save_figure`) and the fingerprint of a saved model
(`model_identity`), which results are keyed on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(path: str | os.PathLike) -> None:
    """Give a file the permissions `open(path, "w")` would have (for files another library wrote privately)."""
    os.chmod(path, 0o666 & ~_umask())


def staging_dir(target: Path) -> Path:
    """A new empty folder beside `target`, to fill and then rename to it, with the permissions `mkdir` would give
    (0777 less the umask), not the 0700 of a private temporary folder."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    os.chmod(staging, 0o777 & ~_umask())
    return staging


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside `path` to write to; renamed to `path` when the block ends without error,
    removed otherwise. `suffix` keeps the extension tools key on (e.g. '.png' for matplotlib)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(descriptor)
    tmp = Path(name)
    try:
        yield tmp
        follow_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def read_json(path: str | os.PathLike) -> dict | None:
    """The JSON object in `path`, or None when there is no such file."""
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def save_figure(fig, path: Path, dpi: int = 130) -> Path:
    """Save a matplotlib `Figure` as PNG via a temporary file, so a crash never leaves half an image."""
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
    return Path(path)


def model_identity(model: str | Path) -> str:
    """A fingerprint of a saved model: sha256 over its config.json and *.safetensors files (16 hex digits). A hub
    id, which is not a local directory, stands for itself."""
    path = Path(model)
    if not path.is_dir():
        return str(model)
    digest = hashlib.sha256()
    for file in [path / "config.json", *sorted(path.glob("*.safetensors"))]:
        if file.is_file():
            digest.update(file.name.encode())
            with file.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
    return digest.hexdigest()[:16]
