"""convattn: BERT-style encoders with self-attention augmented by convolutions.

Importing the package registers the `convattn` model type with the `transformers` Auto classes,
so `AutoModelForMaskedLM.from_pretrained(dir)` works on saved convattn checkpoints.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from convattn.config import ConvAttnConfig
from convattn.electra import ConvAttnForPreTraining
from convattn.model import (
    ConvAttnForMaskedLM,
    ConvAttnForQuestionAnswering,
    ConvAttnForSequenceClassification,
    ConvAttnForTokenClassification,
    ConvAttnModel,
    ConvAttnPreTrainedModel,
)
from convattn.presets import preset_names

__version__ = "0.1.0"

AutoConfig.register(ConvAttnConfig.model_type, ConvAttnConfig, exist_ok=True)
for _auto, _model in (
    (AutoModel, ConvAttnModel),
    (AutoModelForMaskedLM, ConvAttnForMaskedLM),
    (AutoModelForPreTraining, ConvAttnForPreTraining),
    (AutoModelForSequenceClassification, ConvAttnForSequenceClassification),
    (AutoModelForTokenClassification, ConvAttnForTokenClassification),
    (AutoModelForQuestionAnswering, ConvAttnForQuestionAnswering),
):
    _auto.register(ConvAttnConfig, _model, exist_ok=True)

__all__ = [
    "ConvAttnConfig",
    "ConvAttnForMaskedLM",
    "ConvAttnForPreTraining",
    "ConvAttnForQuestionAnswering",
    "ConvAttnForSequenceClassification",
    "ConvAttnForTokenClassification",
    "ConvAttnModel",
    "ConvAttnPreTrainedModel",
    "preset_names",
]
