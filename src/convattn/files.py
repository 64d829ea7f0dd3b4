"""Writing files so that a crash, a kill or a full disk never leaves half a file under the final name.

Each write goes to a uniquely named temporary file beside the target, which is renamed over the target only
once complete; on any failure the temporary file is removed. The result has the permissions an ordinary
`open(path, "w")` would give (0666 less the umask), not the 0600 of a private temporary file, so a model card or
the modeling code of a shared model stays readable by others.

Nothing is written through a link or onto a special file: an atomic write replaces a symbolic link at its target
(never the file it points to) and refuses a device, a named pipe or a socket there (`check_replaceable`); a file
appended to in place (`append_text`, the run's log.txt) must be a plain file, and one with other names too (a hard
link) is first replaced by a copy of its own, so those keep their content.

Also here, as they are about files: reading JSON back (`read_json`), a safetensors file's tensor shapes from its
header (`weight_shapes`) and whether it reads back whole and finite (`check_weight_file`), figures
(`save_figure`), and the fingerprint of a saved model (`model_identity`), which results are keyed on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from convattn.errors import UsageError, listed

SPECIAL_FILES = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a named pipe",
                 stat.S_IFSOCK: "a socket"}
# the name tempfile.mkdtemp gives a `staging_dir` of TARGET: .TARGET.<8 random letters, digits or _>.tmp
STAGING_NAME = re.compile(r"\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(path: str | os.PathLike) -> None:
    """Give a file the permissions `open(path, "w")` would have (for files another library wrote privately)."""
    os.chmod(path, 0o666 & ~_umask())


def special_file(path: str | os.PathLike) -> str | None:
    """What `path` is when it is a device, a named pipe or a socket ("a character device", ...), else None (a link
    is not followed)."""
    try:
        return SPECIAL_FILES.get(stat.S_IFMT(os.lstat(path).st_mode))
    except (FileNotFoundError, NotADirectoryError):
        return None


def check_replaceable(path: str | os.PathLike) -> None:
    """Refuse, naming it, a device, named pipe or socket where a file is to be written (`/dev/null`)."""
    if kind := special_file(path):
        raise UsageError(f"{path} is {kind}, not a file; convattn writes only files: give another path")


def check_plain_file(path: str | os.PathLike) -> None:
    """Refuse, naming it, anything but a plain file (or nothing) where a file is written in place: a symbolic link
    (writing would change the file it points to) or a special file."""
    path = Path(path)
    if path.is_symlink():
        raise UsageError(f"{path} is a symbolic link (to {os.readlink(path)}); convattn writes a run's files only "
                         "inside its folder, never through a link: remove the link")
    check_replaceable(path)


def append_text(path: str | os.PathLike, text: str) -> None:
    """Append `text` to the file `path` (made if needed), never through a link (`check_plain_file`); a file with
    other names too (a hard link) is first replaced by a copy of its own, so that they keep their content."""
    check_plain_file(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK  # (a pipe would block)
    descriptor = os.open(path, flags, 0o666)
    if os.fstat(descriptor).st_nlink > 1:
        os.close(descriptor)
        with atomic_path(path) as tmp:
            shutil.copyfile(path, tmp)
        descriptor = os.open(path, flags, 0o666)
    with os.fdopen(descriptor, "a", encoding="utf-8") as f:
        f.write(text)


def staging_dir(target: Path) -> Path:
    """A new empty folder beside `target`, to fill and then rename to it, with the permissions `mkdir` would give
    (0777 less the umask), not the 0700 of a private temporary folder."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    os.chmod(staging, 0o777 & ~_umask())
    return staging


def staging_target(name: str) -> str | None:
    """The name of the target a folder named `name` stages (`staging_dir`), or None for any other name."""
    match = STAGING_NAME.fullmatch(name)
    return match["target"] if match else None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside `path` to write to; renamed to `path` when the block ends without error,
    removed otherwise. `suffix` keeps the extension tools key on (e.g. '.png' for matplotlib). A symbolic link at
    `path` is replaced, not the file it points to; a special file there is refused (`check_replaceable`)."""
    path = Path(path)
    check_replaceable(path)
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


def read_json(path: str | os.PathLike, *, damaged_as_none: bool = False) -> dict | None:
    """The JSON object in `path` (any JSON value, where the file is not what convattn writes), or None when there is
    no such file; with `damaged_as_none` None also when it cannot be read or is not JSON."""
    path = Path(path)
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (ValueError, OSError):  # UnicodeDecodeError is a ValueError
        if damaged_as_none:
            return None
        raise


def weight_shapes(file: str | os.PathLike) -> dict[str, list[int]]:
    """The shape of each tensor in a safetensors file, read from its header (nothing is loaded)."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as weights:
        return {name: list(weights.get_slice(name).get_shape())
                for name in weights.keys()}  # noqa: SIM118 (a safetensors handle, not a dict)


def index_buffer(name: str) -> bool:
    """A tensor of indices some checkpoints hold beside their weights (BERT's `embeddings.position_ids`)."""
    return name.endswith("_ids")


def check_weight_file(file: Path) -> dict[str, list[int]]:
    """The file opens as safetensors, its weights are floating-point (an integer weight was cast on loading and
    trained without a word; index buffers such as `position_ids` aside) and finite (one UsageError naming them).
    Returns the shape of each weight (`weight_shapes`)."""
    import torch
    from safetensors import safe_open

    try:
        shapes = weight_shapes(file)
        bad, integer = [], []
        with safe_open(str(file), framework="pt") as weights:
            for name in shapes:
                tensor = weights.get_tensor(name)
                if tensor.is_floating_point():
                    if not torch.isfinite(tensor).all():
                        bad.append(name)
                elif not index_buffer(name):
                    integer.append((name, tensor.dtype))
    except OSError as err:
        raise UsageError(f"cannot read {file}: {err.strerror or err}") from None
    except Exception as err:  # safetensors raises its own error type for every kind of damage
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        raise UsageError(f"{file} is truncated or corrupt ({detail}); save or copy the model again") from None
    if integer:
        name, dtype = integer[0]
        more = f" ({len(integer) - 1} more)" if len(integer) > 1 else ""
        raise UsageError(f"{file}: the weight {name} is {str(dtype).removeprefix('torch.')}{more}, not a "
                         "floating-point type, which loading would cast without a word; save the model from its "
                         "floating-point weights (float32, float16 or bfloat16)")
    if bad:
        raise UsageError(f"{file} holds non-finite (NaN or infinite) weights: {listed(bad)}; this model cannot be used "
                         "(a diverged training run?)")
    return shapes


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
