"""Loading checkpoints for analysis (figures are written with `convattn.training.run_folder.save_figure`)."""

from __future__ import annotations

from pathlib import Path

from convattn.errors import UsageError
from convattn.training.run_folder import check_weights


def load_encoder(checkpoint: str | Path):
    """A saved convattn checkpoint (any head) as its bare `ConvAttnModel`, in eval mode."""
    from transformers import AutoConfig, AutoModel

    import convattn  # noqa: F401  (registers the model type)

    path = Path(checkpoint)
    if not (path / "config.json").is_file():
        raise UsageError(f"{checkpoint} is not a saved model directory (no config.json); pass the output "
                         "directory of `convattn pretrain` or a `save_pretrained` directory")
    check_weights(path)
    if AutoConfig.from_pretrained(path).model_type != "convattn":
        raise UsageError(f"{checkpoint} holds a non-convattn model; these plots read convattn's mechanisms")
    return AutoModel.from_pretrained(path).eval()


