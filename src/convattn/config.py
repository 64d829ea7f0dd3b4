"""`ConvAttnConfig`: one config for the encoder and every attention mechanism it can use.

The mechanism is described by composable fields, not one opaque string:

* positions: `position_embedding_type` (absolute, none, rotary with `rope_theta` and `rotary_relative_terms`, alibi);
* composite family (Chang et al. 2021): `relative_terms`,
  `relative_reach`, `relative_out_of_window`, `value_depthwise_conv`, `conv_projections`;
* ConvBERT (Jiang et al. 2020): `head_ratio`, `conv_kernel_size`, `num_groups`, `convbert_padding`,
  `convbert_kernel_from` (Chang et al.'s variant of the convolution heads);
* Linformer / Conv-Linformer (Wang et al. 2020; Malard): `linformer_k`, `sequence_projection`,
  `linformer_sharing`, `linformer_conv`, `linformer_bias`.

Invalid values and combinations raise `ValueError` naming the field and the allowed values.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence

from transformers import PretrainedConfig
from transformers.activations import ACT2FN

from convattn.attn_implementations import TRITON_IMPLEMENTATION

# "rotary": RoFormer's rotate-half rotation of every head's queries and keys (Su et al. 2021; attention/rotary.py);
# dynamic relative terms beside it read the queries and keys before the rotation, so every term depends on offsets;
# "alibi": MosaicBERT's symmetric bias -m_h |i - j| per head (Press et al. 2022; attention/relative/bias.py)
POSITION_EMBEDDING_TYPES = ("absolute", "none", "rotary", "alibi")
RELATIVE_TERMS = ("fixed", "dynamic_query", "dynamic_key")
CONV_PROJECTIONS = ("query", "key", "value")
SEQUENCE_PROJECTIONS = ("none", "linear", "conv")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention", TRITON_IMPLEMENTATION)
QA_HEADS = ("span", "joint")
# Conv-Linformer's layout (Malard's conv_linformer.py): the first L//2 layers project with E/F, the rest
# (L - L//2) with a strided conv
SEQUENCE_PROJECTION_LAYOUTS = {"linear+conv": ("linear", "conv")}
# where a linear sequence projection puts the key / value biases: "after_projection" (fairseq's Linformer:
# E X is projected first, then k_proj / v_proj add their bias once per projected key) or "before_projection"
# (E (X W + b): each projected key gets E's row sum over the real tokens times the bias, as convattn did first)
LINFORMER_BIASES = ("after_projection", "before_projection")
# which token predicts the weight of a ConvBERT convolution-head tap: "query" (Jiang et al. 2020) or "key"
# (Chang et al. 2021's code, see convbert.py)
CONVBERT_KERNELS_FROM = ("query", "key")
# what dynamic relative terms beside rotary read: the queries and keys before the rotation ("unrotated": every term a
# function of the offset, translation invariant) or after it ("rotated": what convattn computed until 2026-11-29,
# kept so that models saved then load with their outputs)
ROTARY_RELATIVE_TERMS = ("unrotated", "rotated")
# the values of each field that takes one of a few: validate_convattn holds the field to them, and the checks of a
# saved model try them to find the field its weights contradict (checkpoint.py)
CHOICES = {
    "position_embedding_type": POSITION_EMBEDDING_TYPES,
    "relative_out_of_window": ("clip", "zero"),
    "convbert_padding": ("masked", "reference"),
    "linformer_sharing": ("headwise", "key_value", "layerwise"),
    "linformer_conv": ("dense", "depthwise"),
    "linformer_bias": LINFORMER_BIASES,
    "convbert_kernel_from": CONVBERT_KERNELS_FROM,
    "rotary_relative_terms": ROTARY_RELATIVE_TERMS,
    "qa_head": QA_HEADS,
    # a layout or one kind for every layer (a list, one kind a layer, is validated on its own)
    "sequence_projection": SEQUENCE_PROJECTIONS + tuple(SEQUENCE_PROJECTION_LAYOUTS),
}
# the fields that hold any subset of their values (kept in this order)
SUBSETS = {"relative_terms": RELATIVE_TERMS, "conv_projections": CONV_PROJECTIONS}
# the fields every convattn version has saved: a config.json without one is damaged (the class default would silently
# stand in). A field added since is left out: configs saved before it are read with its default, which computes what
# they computed
ALWAYS_SAVED = (
    "vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "position_embedding_type",
    "relative_terms", "relative_reach", "relative_out_of_window", "value_depthwise_conv", "conv_projections",
    "conv_projection_kernel", "head_ratio", "conv_kernel_size", "num_groups", "convbert_padding", "linformer_k",
    "sequence_projection", "linformer_sharing", "linformer_conv",
)
# fields a saved config may hold beyond those this class declares and writes: transformers' configs' before version 5
# (generation settings among them), those transformers reads (attn_implementation) or remote code adds (auto_map), and
# convattn's earlier `attention_backend` (read by __post_init__)
SAVED_BY_EARLIER_VERSIONS = frozenset({
    "add_cross_attention", "attn_implementation", "auto_map", "bad_words_ids", "begin_suppress_tokens", "bos_token_id",
    "cross_attention_hidden_size", "decoder_start_token_id", "diversity_penalty", "do_sample", "early_stopping",
    "encoder_no_repeat_ngram_size", "eos_token_id", "exponential_decay_length_penalty", "finetuning_task",
    "forced_bos_token_id", "forced_eos_token_id", "gradient_checkpointing", "is_decoder", "length_penalty",
    "max_length", "min_length", "no_repeat_ngram_size", "num_beam_groups", "num_beams", "num_labels",
    "num_return_sequences", "output_scores", "prefix", "pruned_heads", "remove_invalid_values", "repetition_penalty",
    "return_dict_in_generate", "sep_token_id", "suppress_tokens", "task_specific_params", "temperature",
    "tf_legacy_loss", "tie_encoder_decoder", "tokenizer_class", "top_k", "top_p", "torch_dtype", "torchscript",
    "typical_p", "use_bfloat16", "use_cache",
    "attention_backend",
})


def _choice(field: str, value, allowed: Sequence) -> None:
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}")


def check_attn_implementation(name: str) -> None:
    """A name convattn's mechanisms compute, and for the fused kernel's (TRITON_IMPLEMENTATION) a kernel that can
    run here (one error naming what to install or set)."""
    _choice("attn_implementation", name, ATTN_IMPLEMENTATIONS)
    if name == TRITON_IMPLEMENTATION:
        from convattn.attention.relative.dispatch import check_triton_available

        check_triton_available()


def _subset(field: str, values, allowed: Sequence) -> tuple[str, ...]:
    if isinstance(values, str):
        values = [values] if values else []
    values = tuple(values)
    for v in values:
        if v not in allowed:
            raise ValueError(
                f"{field} contains {v!r}; allowed values are any subset of {', '.join(map(repr, allowed))}"
            )
    if len(set(values)) != len(values):
        raise ValueError(f"{field}={list(values)!r} repeats a value")
    # canonical order, so configs that mean the same thing compare equal
    return tuple(v for v in allowed if v in values)


def _positive(field: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{field}={value!r} must be an integer >= {minimum}")


def _in_range(field: str, value, low: float, high: float, low_open: bool = False, high_open: bool = False) -> None:
    """A finite real number in the interval; NaN and infinities never pass."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and \
        (low < value if low_open else low <= value) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{field}={value!r} must be a finite number in {interval}")


class ConvAttnConfig(PretrainedConfig):
    model_type = "convattn"
    # (class attributes, not fields: no annotation)
    field_choices = CHOICES
    field_subsets = SUBSETS

    vocab_size: int = 30004
    embedding_size: int = 128
    hidden_size: int = 256
    num_hidden_layers: int = 12
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 128
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    mask_token_id: int | None = None
    classifier_dropout: float | None = None
    tie_word_embeddings: bool = True
    # composite-attention family
    position_embedding_type: str = "absolute"
    rope_theta: float = 10000.0  # the base of the rotary frequencies, theta^(-2k/d)
    rotary_relative_terms: str = "unrotated"
    relative_terms: list[str] | tuple[str, ...] = ()
    relative_reach: int = 8
    relative_out_of_window: str = "clip"
    value_depthwise_conv: bool = False
    conv_projections: list[str] | tuple[str, ...] = ()
    conv_projection_kernel: int = 17
    # ConvBERT mixed attention
    head_ratio: int = 1
    conv_kernel_size: int = 9
    num_groups: int = 1
    convbert_padding: str = "masked"
    convbert_kernel_from: str = "query"
    # ELECTRA replaced-token detection (ConvAttnForPreTraining): generator hidden size as a fraction of
    # the discriminator's, the weight of the discriminator's loss, and the share of each sequence's maskable
    # tokens masked for the generator (`convattn pretrain` sets it from --mlm-probability)
    generator_size: float = 0.25
    discriminator_weight: float = 50.0
    mask_probability: float = 0.15
    # ConvAttnForQuestionAnswering: "span" (BERT's start/end linear head, as transformers' ConvBERT) or "joint"
    # (ELECTRA's SQuAD head: start, end given the start, answerability; see qa.py)
    qa_head: str = "span"
    # Linformer / Conv-Linformer
    linformer_k: int = 0
    sequence_projection: str | list[str] = "none"
    linformer_sharing: str = "headwise"
    linformer_conv: str = "dense"
    linformer_bias: str = "after_projection"
    # the preset this config was built from, if any (informational)
    preset: str | None = None

    def __post_init__(self, **kwargs):
        # --- attn_implementation: transformers' own field; `attention_backend`, its name in configs saved by
        # earlier versions, only fills it in
        legacy = kwargs.pop("attention_backend", None)
        super().__post_init__(**kwargs)
        if legacy is not None:
            _choice("attention_backend", legacy, ATTN_IMPLEMENTATIONS)
            if self._attn_implementation is None:
                self._attn_implementation = legacy
        # (the name itself was checked when it was set: __setattr__)
        # --- end attn_implementation
        for field, allowed in SUBSETS.items():
            setattr(self, field, list(_subset(field, getattr(self, field), allowed)))
        if not isinstance(self.sequence_projection, str):
            self.sequence_projection = list(self.sequence_projection)
        # Not transformers' `validate_architecture` hook: it only runs under huggingface_hub's @strict, which
        # re-raises every check as StrictDataclassClassValidationError (not a ValueError), and our documented
        # contract is "ValueError naming the field and the allowed values", raised when the config is built.
        self.validate_convattn()

    def __setattr__(self, key, value):
        # every way of choosing the attention implementation ends here: the config's field, from_pretrained,
        # set_attn_implementation, `config._attn_implementation = ...`
        if key == "_attn_implementation_internal" and value is not None:
            check_attn_implementation(value)
        super().__setattr__(key, value)

    # ------------------------------------------------------------------ derived sizes
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_self_attention_heads(self) -> int:
        """Heads that compute softmax(QK^T) attention (all of them unless ConvBERT splits them)."""
        return self.num_attention_heads // self.head_ratio

    @property
    def attention_head_size(self) -> int:
        """The width of one self-attention head's queries and keys (ConvBERT's heads share half the hidden size)."""
        if self.uses_convbert:
            return self.hidden_size // 2 // self.num_self_attention_heads
        return self.head_dim

    @property
    def uses_convbert(self) -> bool:
        return self.head_ratio > 1

    @property
    def relative_kernel_size(self) -> int:
        return 2 * self.relative_reach + 1

    @property
    def layer_projections(self) -> list[str]:
        """The sequence projection of each layer ("none", "linear" or "conv")."""
        spec, layers = self.sequence_projection, self.num_hidden_layers
        if isinstance(spec, str) and spec in SEQUENCE_PROJECTION_LAYOUTS:
            first, second = SEQUENCE_PROJECTION_LAYOUTS[spec]
            return [first] * (layers // 2) + [second] * (layers - layers // 2)
        if isinstance(spec, str):
            return [spec] * layers
        return list(spec)

    @property
    def projection_kinds(self) -> set[str]:
        """The sequence projections the layers use, without listing every layer (validation reads this: a count of
        10^9 layers in a damaged config.json would otherwise be a list of 10^9 before it is refused)."""
        spec, layers = self.sequence_projection, self.num_hidden_layers
        if isinstance(spec, str) and spec in SEQUENCE_PROJECTION_LAYOUTS:
            first, second = SEQUENCE_PROJECTION_LAYOUTS[spec]
            return {kind for kind, count in ((first, layers // 2), (second, layers - layers // 2)) if count}
        return {spec} if isinstance(spec, str) else set(spec)

    @property
    def max_input_length(self) -> int | None:
        """The longest input the model takes: max_position_embeddings with absolute position embeddings or
        Linformer projections (both sized to it), else None (any length: nothing depends on absolute position)."""
        fixed = self.position_embedding_type == "absolute" or bool(self.projection_kinds - {"none"})
        return self.max_position_embeddings if fixed else None

    # ------------------------------------------------------------------ validation
    def validate_convattn(self) -> None:
        for field in ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            _positive(field, getattr(self, field))
        for field, allowed in CHOICES.items():
            if field != "sequence_projection" or isinstance(self.sequence_projection, str):  # (one a layer: below)
                _choice(field, getattr(self, field), allowed)
        _in_range("rope_theta", self.rope_theta, 0, math.inf, low_open=True, high_open=True)
        _positive("relative_reach", self.relative_reach)
        _positive("head_ratio", self.head_ratio)
        _positive("num_groups", self.num_groups)
        if isinstance(self.hidden_act, str):
            _choice("hidden_act", self.hidden_act, sorted(ACT2FN))
        for field in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            if getattr(self, field) is not None:
                _in_range(field, getattr(self, field), 0, 1, high_open=True)
        _in_range("layer_norm_eps", self.layer_norm_eps, 0, 1, low_open=True)
        _in_range("initializer_range", self.initializer_range, 0, math.inf, low_open=True, high_open=True)
        _in_range("generator_size", self.generator_size, 0, 1, low_open=True)  # a fraction of hidden_size
        _in_range("discriminator_weight", self.discriminator_weight, 0, math.inf, high_open=True)
        _in_range("mask_probability", self.mask_probability, 0, 1, low_open=True)
        _positive("linformer_k", self.linformer_k, minimum=0)
        for field in ("conv_projection_kernel", "conv_kernel_size"):
            value = getattr(self, field)
            _positive(field, value)
            if value % 2 == 0:
                raise ValueError(f"{field}={value} must be odd so the convolution is centred on each token")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be divisible by num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.head_ratio:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be divisible by head_ratio={self.head_ratio}"
            )
        for field, size in (("intermediate_size", self.intermediate_size), ("hidden_size", self.hidden_size)):
            if size % self.num_groups:
                raise ValueError(f"{field}={size} must be divisible by num_groups={self.num_groups}")
        if self.conv_projections and self.num_attention_heads % 2:
            raise ValueError(
                "conv_projections puts convolutions in half the heads, so num_attention_heads "
                f"must be even (got {self.num_attention_heads})"
            )
        if self.conv_projections and self.uses_convbert:
            raise ValueError("conv_projections cannot be combined with ConvBERT (head_ratio > 1): choose one")
        if self.convbert_kernel_from != "query" and not self.uses_convbert:
            raise ValueError(
                f"convbert_kernel_from={self.convbert_kernel_from!r} has no effect without ConvBERT's convolution "
                "heads; set head_ratio > 1 or convbert_kernel_from='query'"
            )
        if self.value_depthwise_conv and self.uses_convbert:
            raise ValueError("value_depthwise_conv cannot be combined with ConvBERT (head_ratio > 1): choose one")
        self._validate_positions()
        if not isinstance(self.sequence_projection, str):
            if len(self.sequence_projection) != self.num_hidden_layers:
                raise ValueError(
                    f"sequence_projection lists {len(self.sequence_projection)} layers but num_hidden_layers="
                    f"{self.num_hidden_layers}; give one value for all layers, a layout "
                    f"({', '.join(SEQUENCE_PROJECTION_LAYOUTS)}) or one value per layer"
                )
            for kind in self.sequence_projection:
                _choice("sequence_projection", kind, SEQUENCE_PROJECTIONS)
        if self.projection_kinds - {"none"}:
            self._validate_linformer()
        else:
            unused = {"linformer_k": (self.linformer_k, 0), "linformer_sharing": (self.linformer_sharing, "headwise"),
                      "linformer_conv": (self.linformer_conv, "dense"),
                      "linformer_bias": (self.linformer_bias, LINFORMER_BIASES[0])}
            for field, (value, default) in unused.items():
                if value != default:
                    raise ValueError(
                        f"{field}={value!r} has no effect while sequence_projection is 'none' in every layer; "
                        f"set sequence_projection to 'linear' or 'conv' (or per layer), or {field}={default!r}"
                    )

    def _validate_positions(self) -> None:
        rotary = self.position_embedding_type == "rotary"
        if self.rope_theta != ConvAttnConfig.rope_theta and not rotary:
            raise ValueError(f"rope_theta={self.rope_theta!r} has no effect without rotary positions; set "
                             f"position_embedding_type='rotary' or rope_theta={ConvAttnConfig.rope_theta!r}")
        default = ConvAttnConfig.rotary_relative_terms
        if self.rotary_relative_terms != default and not reads_rotary_projections(vars(self)):
            raise ValueError(f"rotary_relative_terms={self.rotary_relative_terms!r} has no effect without rotary "
                             "positions and a dynamic relative term (dynamic_query, dynamic_key); set "
                             f"rotary_relative_terms={default!r}")
        if rotary and self.attention_head_size % 2:
            raise ValueError(f"position_embedding_type='rotary' rotates pairs of channels, so the attention heads' "
                             f"size must be even (got {self.attention_head_size})")

    def _validate_linformer(self) -> None:
        n, k = self.max_position_embeddings, self.linformer_k
        if k < 1:
            raise ValueError("sequence_projection needs linformer_k >= 1 (the projected length)")
        if k > n:
            raise ValueError(f"linformer_k={k} must not exceed max_position_embeddings={n}")
        if "conv" in self.projection_kinds and n % k:
            raise ValueError(
                f"sequence_projection 'conv' uses kernel = stride = max_position_embeddings // linformer_k, so "
                f"max_position_embeddings={n} must be divisible by linformer_k={k}"
            )
        incompatible = {
            "relative_terms": bool(self.relative_terms),
            "value_depthwise_conv": self.value_depthwise_conv,
            "conv_projections": bool(self.conv_projections),
            "head_ratio": self.uses_convbert,
        }
        for field, used in incompatible.items():
            if used:
                raise ValueError(
                    f"{field} cannot be combined with sequence_projection (Linformer): the projected keys "
                    "no longer correspond to token positions"
                )
        if self.position_embedding_type in ("rotary", "alibi"):
            raise ValueError(
                f"position_embedding_type={self.position_embedding_type!r} cannot be combined with sequence_projection "
                "(Linformer): keys projected along the sequence have no positions to rotate or to bias"
            )
        if self.linformer_sharing == "layerwise" and len(self.projection_kinds - {"none"}) > 1:
            raise ValueError(
                "linformer_sharing='layerwise' needs the same sequence_projection in every projected layer"
            )

    # ------------------------------------------------------------------ loading and saving
    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        return super().from_dict(keep_saved_function(config_dict), **kwargs)

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        """Also writes the modeling code and `auto_map` (every model saves its config through here), so
        `AutoModel*.from_pretrained(dir, trust_remote_code=True)` works where convattn is not installed; a checkpoint
        (inside `remote_code.without_remote_code`) gets neither."""
        from convattn.remote_code import auto_map, wanted, write_remote_code

        os.makedirs(save_directory, exist_ok=True)
        if not wanted():  # a checkpoint: convattn resumes it; no code, and no auto_map naming code that is not there
            kept = self.__dict__.pop("auto_map", None)
            try:
                return super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
            finally:
                if kept is not None:
                    self.auto_map = kept
        write_remote_code(save_directory, type(self).__module__)
        self.auto_map = auto_map()
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_preset(cls, name: str, **overrides) -> ConvAttnConfig:
        """Build the config of a named preset (see `convattn presets`), with field overrides."""
        from convattn.presets import preset_fields

        fields = preset_fields(name)
        fields.update(overrides)
        return cls(**fields, preset=name)


def reads_rotary_projections(fields: dict) -> bool:
    """Whether a config's (or a config.json's) rotary positions sit beside relative terms that read the queries or
    keys, the one case in which rotary_relative_terms changes what is computed."""
    terms = fields.get("relative_terms") or ()
    terms = [terms] if isinstance(terms, str) else terms
    return fields.get("position_embedding_type") == "rotary" and bool({"dynamic_query", "dynamic_key"} & set(terms))


def unsure_rotary_terms(config_dict: dict) -> str | None:
    """For a saved config (it has `transformers_version`) with rotary positions beside dynamic relative terms that
    predates `rotary_relative_terms`: the line saying how it is read and how to read it as an earlier convattn
    computed it. Such configs were written both before 2026-11-29 (terms from the rotated queries and keys) and
    after (from the unrotated ones), with nothing in them to tell which; None for every other config."""
    if ("transformers_version" not in config_dict or "rotary_relative_terms" in config_dict
            or not reads_rotary_projections(config_dict)):
        return None
    return ("config.json has rotary positions beside dynamic relative terms and no rotary_relative_terms (saved "
            "before the field existed): read as 'unrotated' (the terms read the queries and keys before the "
            "rotation, as convattn computes since 2026-11-29); a model saved before then computed them from the "
            "rotated ones: add \"rotary_relative_terms\": \"rotated\" to its config.json to get its outputs back, "
            "or \"unrotated\" to keep these and silence this line")


def keep_saved_function(config_dict: dict) -> dict:
    """A saved config (it has `transformers_version`) written before `linformer_bias` existed, rewritten to
    compute what it computed then: the "linear+conv" layout at odd depth as its old explicit split (linear in
    the first L - L//2 layers, one more than Malard's) and the biases before the linear projection. One that
    predates `rotary_relative_terms` and which it changes is said (`unsure_rotary_terms`)."""
    if note := unsure_rotary_terms(config_dict):
        warnings.warn(note, stacklevel=3)
    if "transformers_version" not in config_dict or "linformer_bias" in config_dict:
        return config_dict
    upgraded = dict(config_dict)
    layers = upgraded.get("num_hidden_layers", ConvAttnConfig.num_hidden_layers)
    projection = upgraded.get("sequence_projection", ConvAttnConfig.sequence_projection)
    old_split = ["linear"] * (layers - layers // 2) + ["conv"] * (layers // 2)
    if projection == "linear+conv" and layers % 2:
        upgraded["sequence_projection"] = old_split
    if projection in ("linear", "linear+conv") or (not isinstance(projection, str) and "linear" in projection):
        upgraded["linformer_bias"] = "before_projection"
    return upgraded
