"""Loading checkpoints for analysis and writing figures atomically."""

from __future__ import annotations

import os
from pathlib import Path

from convattn.errors import UsageError


def load_encoder(checkpoint: str | Path):
    """A saved convattn checkpoint (any head) as its bare `ConvAttnModel`, in eval mode."""
    from transformers import AutoConfig, AutoModel

    import convattn  # noqa: F401  (registers the model type)

    path = Path(checkpoint)
    if not (path / "config.json").is_file():
        raise UsageError(f"{checkpoint} is not a saved model directory (no config.json); pass the output "
                         "directory of `convattn pretrain` or a `save_pretrained` directory")
    if AutoConfig.from_pretrained(path).model_type != "convattn":
        raise UsageError(f"{checkpoint} holds a non-convattn model; these plots read convattn's mechanisms")
    return AutoModel.from_pretrained(path).eval()


def load_tokenizer(checkpoint: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(checkpoint)
    except (OSError, ValueError) as err:
        raise UsageError(f"{checkpoint} has no tokenizer to encode the text; save one with the model "
                         f"(`convattn pretrain` does) ({err.__class__.__name__})") from err


def save_figure(fig, path: Path) -> Path:
    """Save a matplotlib `Figure` as PNG via a temporary file, so a crash never leaves half an image."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=130, bbox_inches="tight")
    os.replace(tmp, path)
    return path
