"""A model folder checked before anything uses it, and models loaded from it with every weight accounted for.

`check_model_folder` reads a local folder the way a careful user would before trusting it:

* config.json exists, is JSON, names a `model_type` that transformers (or convattn) knows, holds only finite
  numbers, and, for a convattn config, only the fields convattn knows (the unknown ones are named);
* the weights are safetensors (a folder of pickles only, `pytorch_model.bin`, gets the line that converts it),
  every *.safetensors file opens, and every floating-point weight is a finite number.

A hub id (no local folder) is checked once loaded (`load_checked`). `load_checked` loads with safetensors only and
refuses a model whose encoder weights are missing, of another shape, or left over (a config that does not
describe the weights): only a new task head may be initialised here.

A ground-floor module: it imports nothing from convattn.training or convattn.commands.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from convattn.errors import UsageError, listed
from convattn.runs.pretrain import RNG_STATE, TRAINER_STATE_FILES

CONFIG_FILE = "config.json"
PICKLED_WEIGHTS = ("pytorch_model.bin", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
# the fields transformers' own configs have (this version's and earlier ones'), which any saved config may hold
TRANSFORMERS_FIELDS = frozenset({
    "architectures", "auto_map", "dtype", "torch_dtype", "transformers_version", "model_type", "_name_or_path",
    "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "output_hidden_states",
    "output_attentions", "return_dict", "torchscript", "use_bfloat16", "tf_legacy_loss", "pruned_heads",
    "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder", "add_cross_attention", "tie_encoder_decoder",
    "cross_attention_hidden_size", "attn_implementation", "use_cache", "gradient_checkpointing", "tokenizer_class",
    "prefix", "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id", "task_specific_params",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
})
# fields of convattn configs saved by earlier versions, still read
LEGACY_CONVATTN_FIELDS = frozenset({"attention_backend"})


def conversion_hint(folder: Path | str, weights: str = "pytorch_model.bin") -> str:
    """How to turn a pickle-only folder into safetensors, as one shell line."""
    return (f"convert it once with: python -c \"import torch; from safetensors.torch import save_file; "
            f"save_file(torch.load('{Path(folder) / weights}', weights_only=True), "
            f"'{Path(folder) / 'model.safetensors'}')\" (or load it with transformers and save_pretrained)")


@dataclass(frozen=True)
class ModelFolder:
    source: str    # the folder or hub id, as given
    config: object  # the transformers config it holds
    local: bool

    @property
    def model_type(self) -> str:
        return self.config.model_type

    @property
    def is_convattn(self) -> bool:
        return self.model_type == "convattn"

    def foreign_note(self, use: str) -> str:
        """One line saying that this is not a convattn model and what is done with it instead."""
        return f"{self.source} is a transformers {self.model_type} model, not a convattn model: {use}"


# ---------------------------------------------------------------------------------- config.json
def non_finite_fields(value, path: str = "") -> list[str]:
    """The dotted names of the NaN or infinite numbers in a parsed JSON value."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path or "the value"]
    if isinstance(value, dict):
        return [name for key, item in value.items() for name in non_finite_fields(item, f"{path}.{key}".strip("."))]
    if isinstance(value, list):
        return [name for i, item in enumerate(value) for name in non_finite_fields(item, f"{path}[{i}]")]
    return []


def read_config_json(file: Path) -> dict:
    """config.json parsed (one UsageError when it is unreadable, not JSON, not an object or not finite)."""
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{file} is not a text file; expected a JSON model config") from None
    except OSError as err:
        raise UsageError(f"cannot read {file}: {err.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{file} is not JSON ({err.msg} at line {err.lineno}, column {err.colno}); save the "
                         "model again or restore the file") from None
    if not isinstance(data, dict):
        raise UsageError(f"{file} holds a JSON {type(data).__name__}, not a model config (a JSON object)")
    if bad := non_finite_fields(data):
        raise UsageError(f"{file}: {', '.join(bad)} must be a finite number (found NaN or infinity)")
    return data


def known_convattn_fields() -> frozenset[str]:
    from convattn.config import ConvAttnConfig

    annotated = {name for cls in ConvAttnConfig.__mro__ for name in getattr(cls, "__annotations__", {})
                 if not name.startswith("_")}
    return frozenset(annotated | set(ConvAttnConfig().to_dict()) | TRANSFORMERS_FIELDS | LEGACY_CONVATTN_FIELDS)


def check_config_fields(data: dict, file: Path) -> None:
    """model_type is known; a convattn config holds only convattn's fields."""
    from transformers import CONFIG_MAPPING

    import convattn

    convattn.register_auto_classes()
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise UsageError(f"{file} has no \"model_type\"; a saved model's config names it (e.g. \"convattn\")")
    if model_type not in CONFIG_MAPPING:
        raise UsageError(f"{file}: model_type {model_type!r} is neither convattn nor a model type this transformers "
                         "knows")
    if model_type == "convattn" and (unknown := sorted(set(data) - known_convattn_fields())):
        raise UsageError(f"{file} has fields convattn does not know: {', '.join(unknown)}; remove them (or use the "
                         "convattn version that wrote this model)")


def load_config(folder: Path, data: dict):
    """The config object; a value the config class refuses is one line naming the file."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder)
    except (ValueError, TypeError, KeyError, OSError) as err:
        message = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UsageError(f"{folder / CONFIG_FILE}: {message}") from None


# ---------------------------------------------------------------------------------- weights
def weight_files(folder: Path) -> list[Path]:
    """The *.safetensors files of a folder; a pickle-only or weightless folder is one UsageError."""
    files = sorted(folder.glob("*.safetensors"))
    if files:
        check_shards_present(folder)
        return files
    pickles = sorted({p.name for pattern in PICKLED_WEIGHTS for p in folder.glob(pattern)})
    weights = [name for name in pickles if not is_training_state(name)]
    if weights:
        raise UsageError(f"{folder} holds only pickled weights ({', '.join(weights)}); convattn loads safetensors "
                         f"only (a pickle can run code when loaded): {conversion_hint(folder, weights[0])}")
    if pickles:
        raise UsageError(f"{folder} is a training checkpoint without its model.safetensors (it holds only the "
                         f"trainer's state: {listed(pickles)}); use an earlier checkpoint or the run's final model")
    raise UsageError(f"{folder} has no model weights (no *.safetensors file); save the model with save_pretrained")


def is_training_state(name: str) -> bool:
    """A file of the Trainer's state in a checkpoint (optimizer, scheduler, RNG, arguments): not weights."""
    return name in TRAINER_STATE_FILES or name == "training_args.bin" or RNG_STATE.fullmatch(name) is not None


def check_shards_present(folder: Path) -> None:
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(f"{index} is not a safetensors index (JSON with a \"weight_map\")") from None
    if missing := sorted(s for s in shards if not (folder / s).is_file()):
        raise UsageError(f"{folder} lacks the weight shards {', '.join(missing)} listed in {index.name}")


def check_weight_file(file: Path) -> None:
    """The file opens as safetensors and its floating-point tensors are finite (one UsageError naming them)."""
    import torch
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as weights:
            bad = [name for name in weights.keys()  # noqa: SIM118 (a safetensors handle, not a dict)
                   if (tensor := weights.get_tensor(name)).is_floating_point() and not torch.isfinite(tensor).all()]
    except OSError as err:
        raise UsageError(f"cannot read {file}: {err.strerror or err}") from None
    except Exception as err:  # safetensors raises its own error type for every kind of damage
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        raise UsageError(f"{file} is truncated or corrupt ({detail}); save or copy the model again") from None
    if bad:
        raise UsageError(f"{file} holds non-finite (NaN or infinite) weights: {listed(bad)}; this model cannot be used "
                         "(a diverged training run?)")


# ---------------------------------------------------------------------------------- the whole folder
def check_model_folder(model: str | Path, flag: str = "--model", need_convattn: str | None = None) -> ModelFolder:
    """Check a model folder (see the module docstring) and return it with its config. `need_convattn`: why only
    a convattn model will do (the error's ending); None accepts any transformers model."""
    path = Path(model)
    if not path.exists():
        return check_hub_model(str(model), flag, need_convattn)
    if not path.is_dir():
        raise UsageError(f"{flag} {model} is a file; give the model's folder (with config.json and "
                         "model.safetensors)")
    file = path / CONFIG_FILE
    if not file.is_file():
        raise UsageError(f"{flag} {model} has no {CONFIG_FILE}: not a saved model folder (give the folder "
                         "save_pretrained or `convattn pretrain` wrote)")
    data = read_config_json(file)
    check_config_fields(data, file)
    folder = ModelFolder(str(model), load_config(path, data), local=True)
    require_convattn(folder, need_convattn)
    for weights in weight_files(path):
        check_weight_file(weights)
    return folder


def check_hub_model(model: str, flag: str, need_convattn: str | None) -> ModelFolder:
    """A hub id: its config, fetched (or read from the cache); the weights are checked once loaded."""
    from transformers import AutoConfig

    import convattn
    from convattn.data.hub_access import offline_unless_reachable, stay_offline

    convattn.register_auto_classes()
    with offline_unless_reachable() as online:
        try:
            config = AutoConfig.from_pretrained(model)
        except (OSError, ValueError) as err:
            message = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            if not online:
                message = "the hub does not answer (offline?) and the local cache does not hold it"
            raise UsageError(f"{flag} {model}: no such folder, and no hub model of that name could be loaded "
                             f"({message}); give a local model folder") from None
    if not online:
        stay_offline()  # the tokenizer and the weights come from the cache too, without retries
    folder = ModelFolder(model, config, local=False)
    require_convattn(folder, need_convattn)
    return folder


def require_convattn(folder: ModelFolder, need_convattn: str | None) -> None:
    if need_convattn and not folder.is_convattn:
        raise UsageError(f"{folder.source} is a transformers {folder.model_type} model, not a convattn model; "
                         f"{need_convattn}")


# ---------------------------------------------------------------------------------- loading
def is_task_head(model, key: str) -> bool:
    """A parameter a fine-tuning model may add: its task head, outside the encoder, or the encoder's pooler (BERT's
    next-sentence [CLS] layer, which a masked-LM checkpoint lacks). A bare encoder adds nothing."""
    if model.base_model is model:
        return False
    return not key.startswith(f"{model.base_model_prefix}.") or key.startswith(f"{model.base_model_prefix}.pooler.")


def in_encoder(model, key: str) -> bool:
    """A checkpoint key that belongs to the encoder (with or without the model's prefix)."""
    children = {name for name, _ in model.base_model.named_children()}
    return key.startswith(f"{model.base_model_prefix}.") or key.split(".", 1)[0] in children


def loading_problems(model, info: dict, allow_new_head: bool = True) -> list[str]:
    """What went wrong when loading, in words: weights missing (a new task head aside, when `allow_new_head`), of
    another shape, or encoder weights left over."""
    def allowed(key: str) -> bool:
        return allow_new_head and is_task_head(model, key)

    missing = sorted(k for k in info.get("missing_keys", ()) if not allowed(k))
    unexpected = sorted(k for k in info.get("unexpected_keys", ()) if in_encoder(model, k))
    mismatched = sorted((entry for entry in info.get("mismatched_keys", ()) if not allowed(entry[0])),
                        key=lambda entry: entry[0])
    problems = []
    if missing:
        problems.append(f"{len(missing)} weights are missing from the file ({', '.join(missing[:2])}...)"
                        if len(missing) > 2 else f"weights missing from the file: {', '.join(missing)}")
    if mismatched:
        key, saved, expected = mismatched[0]
        problems.append(f"{key} has shape {list(saved)} in the file but the config asks for {list(expected)}"
                        + (f" ({len(mismatched) - 1} more)" if len(mismatched) > 1 else ""))
    if unexpected:
        problems.append(f"{len(unexpected)} weights in the file fit no part of this model ({unexpected[0]}...)")
    return problems


def load_checked(auto_class, folder: ModelFolder | str, allow_new_head: bool = True, **kwargs):
    """`auto_class.from_pretrained(source, **kwargs)` with safetensors only, every encoder weight loaded from the
    file (only a task head may be new, and only when `allow_new_head`) and every weight finite; anything else is
    one UsageError."""
    import torch

    source = folder.source if isinstance(folder, ModelFolder) else str(folder)
    try:
        model, info = auto_class.from_pretrained(source, use_safetensors=True, output_loading_info=True,
                                                 ignore_mismatched_sizes=True, **kwargs)
    except OSError as err:
        message = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise UsageError(f"could not load the model from {source}: {message}") from None
    if problems := loading_problems(model, info, allow_new_head):
        raise UsageError(f"{source}: the weights do not match the config ({'; '.join(problems)}); is config.json "
                         "the one saved with these weights?")
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p.detach()).all()]
    if bad:
        raise UsageError(f"{source} holds non-finite (NaN or infinite) weights: {', '.join(bad[:3])}")
    return model
