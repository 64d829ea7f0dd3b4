"""Convert between `transformers`' ConvBERT models (Jiang et al. 2020; the published YituTech checkpoints)
and convattn ConvBERT models.

Weights map 1:1 (renames only): the encoder's names are HF's, `convbert.` becomes `convattn.`, and
HF's masked-LM head `generator_predictions.{dense,LayerNorm}` + `generator_lm_head.{weight,bias}`
becomes `mlm_head.{dense,LayerNorm}` + `mlm_head.{decoder.weight,bias}`.

On unpadded inputs converted models compute the same outputs in either padding mode. On padded
inputs HF lets padding leak into the convolution heads; `convbert_padding="reference"` reproduces
that exactly, the default "masked" fixes it.
"""

from __future__ import annotations

import os

import transformers
from torch import nn
from transformers import ConvBertConfig, PreTrainedModel

from convattn.config import ConvAttnConfig
from convattn.model import (
    ConvAttnForMaskedLM,
    ConvAttnForQuestionAnswering,
    ConvAttnForSequenceClassification,
    ConvAttnForTokenClassification,
    ConvAttnModel,
)

# HF class name -> our class; the encoder prefix is "convbert." there and "convattn." here
MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {
    "ConvBertModel": ConvAttnModel,
    "ConvBertForMaskedLM": ConvAttnForMaskedLM,
    "ConvBertForSequenceClassification": ConvAttnForSequenceClassification,
    "ConvBertForTokenClassification": ConvAttnForTokenClassification,
    "ConvBertForQuestionAnswering": ConvAttnForQuestionAnswering,
}
HEAD_RENAMES = {  # HF prefix -> ours (everything else keeps its name)
    "convbert.": "convattn.",
    "generator_predictions.": "mlm_head.",
    "generator_lm_head.weight": "mlm_head.decoder.weight",
    "generator_lm_head.bias": "mlm_head.bias",
}
# config fields with the same name and meaning in both
SHARED_FIELDS = (
    "vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
    "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id", "classifier_dropout",
    "tie_word_embeddings", "head_ratio", "conv_kernel_size", "num_groups", "problem_type", "id2label",
)


def _rename(name: str, renames: dict[str, str]) -> str:
    for old, new in sorted(renames.items(), key=lambda item: -len(item[0])):  # most specific first
        if name.startswith(old):
            return new + name[len(old):]
    return name


def config_from_transformers(hf_config: ConvBertConfig, convbert_padding: str = "masked") -> ConvAttnConfig:
    if hf_config.head_ratio < 2:
        raise ValueError(f"head_ratio={hf_config.head_ratio}: only ConvBERT models with conv heads (head_ratio >= 2) "
                         "convert; HF's head_ratio=1 halves every head, which convattn does not model")
    fields = {field: getattr(hf_config, field) for field in SHARED_FIELDS}
    return ConvAttnConfig(**fields, position_embedding_type="absolute", convbert_padding=convbert_padding)


def config_to_transformers(config: ConvAttnConfig) -> ConvBertConfig:
    unsupported = {
        "head_ratio": not config.uses_convbert,
        "position_embedding_type": config.position_embedding_type != "absolute",
        "relative_terms": bool(config.relative_terms),
        "conv_projections": bool(config.conv_projections),
        "value_depthwise_conv": config.value_depthwise_conv,
        "sequence_projection": any(kind != "none" for kind in config.layer_projections),
    }
    for field, used in unsupported.items():
        if used:
            raise ValueError(f"{field}={getattr(config, field)!r} has no equivalent in transformers' ConvBERT; "
                             "only ConvBERT models (head_ratio >= 2, absolute positions, no extra terms) convert")
    return ConvBertConfig(**{field: getattr(config, field) for field in SHARED_FIELDS})


def _load_transformers(path: str | os.PathLike) -> PreTrainedModel:
    hf_config = transformers.AutoConfig.from_pretrained(path)
    if not isinstance(hf_config, ConvBertConfig):
        raise ValueError(f"{path} holds a {type(hf_config).__name__}, not a ConvBertConfig")
    architecture = (hf_config.architectures or ["ConvBertModel"])[0]
    if architecture not in MODEL_CLASSES:
        raise ValueError(f"{path} holds a {architecture}; supported: {', '.join(MODEL_CLASSES)}")
    return getattr(transformers, architecture).from_pretrained(path)  # model.safetensors, else pytorch_model.bin


def from_transformers(model_or_path: PreTrainedModel | str | os.PathLike,
                      convbert_padding: str = "masked") -> PreTrainedModel:
    """A transformers ConvBERT model (object or saved directory) -> the matching convattn model, in eval mode.

    `convbert_padding="reference"` keeps HF's padding leak (identical outputs on padded inputs too).
    """
    hf_model = model_or_path if isinstance(model_or_path, nn.Module) else _load_transformers(model_or_path)
    kind = type(hf_model).__name__
    if kind not in MODEL_CLASSES:
        raise ValueError(f"cannot convert a {kind}; supported: {', '.join(MODEL_CLASSES)}")
    model = MODEL_CLASSES[kind](config_from_transformers(hf_model.config, convbert_padding))
    state = {_rename(name, HEAD_RENAMES): tensor for name, tensor in hf_model.state_dict().items()}
    model.load_state_dict(state, strict=True)
    return model.eval()


def to_transformers(model: PreTrainedModel) -> PreTrainedModel:
    """A convattn ConvBERT model -> the matching transformers ConvBERT model, in eval mode."""
    ours_to_hf = {ours: hf for hf, ours in MODEL_CLASSES.items()}
    if type(model) not in ours_to_hf:
        raise ValueError(f"cannot convert a {type(model).__name__}; supported: "
                         f"{', '.join(cls.__name__ for cls in ours_to_hf)}")
    hf_model = getattr(transformers, ours_to_hf[type(model)])(config_to_transformers(model.config))
    back = {new: old for old, new in HEAD_RENAMES.items()}
    hf_model.load_state_dict({_rename(name, back): tensor for name, tensor in model.state_dict().items()}, strict=True)
    return hf_model.eval()
