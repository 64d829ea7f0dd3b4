"""convattn: BERT-style encoders with self-attention augmented by convolutions.

Importing the package registers the `convattn` model type with the `transformers` Auto classes,
so `AutoModelForMaskedLM.from_pretrained(dir)` works on saved convattn checkpoints.

The command line (`convattn ...`, `python -m convattn ...`) is the one exception: it starts without torch and
transformers, so that `--help` and `convattn presets` answer at once, and registers the Auto classes itself
(`register_auto_classes`) before a command that loads models. The public names below load on first use.
"""

import importlib
import sys
from pathlib import Path

__version__ = "0.1.0"

_PUBLIC = {
    "ConvAttnConfig": "convattn.config",
    "ConvAttnForPreTraining": "convattn.electra",
    "ConvAttnForMaskedLM": "convattn.model",
    "ConvAttnForQuestionAnswering": "convattn.model",
    "ConvAttnForSequenceClassification": "convattn.model",
    "ConvAttnForTokenClassification": "convattn.model",
    "ConvAttnModel": "convattn.model",
    "ConvAttnPreTrainedModel": "convattn.model",
    "preset_names": "convattn.presets",
}


def register_auto_classes() -> None:
    """Register model type "convattn" with the transformers Auto classes (idempotent), one entry point per Auto
    class as saved checkpoints name them (`remote_code.AUTO_MAP`), and the fused kernel with its
    AttentionInterface under its attn_implementation (TRITON_IMPLEMENTATION)."""
    import transformers

    from convattn.attention.relative.dispatch import TRITON_IMPLEMENTATION, triton_interface_attention
    from convattn.config import ConvAttnConfig
    from convattn.remote_code import AUTO_MAP

    transformers.AttentionInterface.register(TRITON_IMPLEMENTATION, triton_interface_attention)
    transformers.AutoConfig.register(ConvAttnConfig.model_type, ConvAttnConfig, exist_ok=True)
    for auto, (module, name) in AUTO_MAP.items():
        if auto != "AutoConfig":
            model_class = getattr(importlib.import_module(module), name)
            getattr(transformers, auto).register(ConvAttnConfig, model_class, exist_ok=True)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'convattn' has no attribute {name!r}")
    register_auto_classes()
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def _started_as_command_line() -> bool:
    """True while `python -m convattn` locates its module (argv[0] is then '-m') or the `convattn` script runs."""
    return bool(sys.argv) and (sys.argv[0] == "-m" or Path(sys.argv[0]).name == "convattn")


if not _started_as_command_line():
    register_auto_classes()

__all__ = list(_PUBLIC)
