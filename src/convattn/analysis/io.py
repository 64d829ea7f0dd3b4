"""Loading checkpoints for analysis (figures are written with `convattn.files.save_figure`)."""

from __future__ import annotations

from pathlib import Path

from convattn.checkpoint import check_model_folder, load_checked
from convattn.errors import UsageError


def load_encoder(checkpoint: str | Path):
    """A saved convattn checkpoint (any head) as its bare `ConvAttnModel`, in eval mode; the folder is checked
    first (`convattn.checkpoint.check_model_folder`)."""
    from transformers import AutoModel

    if not Path(checkpoint).is_dir():
        raise UsageError(f"{checkpoint} is not a saved model directory; pass the output directory of "
                         "`convattn pretrain` or a `save_pretrained` directory")
    folder = check_model_folder(checkpoint, flag="checkpoint",
                                need_convattn="these plots read convattn's mechanisms")
    return load_checked(AutoModel, folder).eval()
