"""A model folder checked before anything uses it, and models loaded from it with every weight accounted for.

`check_model_folder` reads a local folder the way a careful user would before trusting it:

* config.json exists, is JSON, names a `model_type` that transformers (or convattn) knows, holds only finite
  numbers, a torch `dtype`, special-token ids inside the vocabulary, and, for a convattn config, every field
  convattn writes, each of the type it writes, and no field convattn does not know (the unknown ones are named);
* the weights are safetensors (a folder of pickles only, `pytorch_model.bin`, gets the line that converts it),
  every *.safetensors file opens, every weight is floating-point (index buffers such as position_ids aside) and
  a finite number;
* the model the config describes, built on the meta device (shapes without memory: a tampered size of 10^9 costs
  nothing), holds exactly the tensors of the safetensors headers, each of its shape (`convattn.meta_model`); the
  line names the config field the weights contradict (the layers' count, a size, a table the config declares or
  not), found by asking the model, not from a list kept here.

`check_tokenizer_fits` holds a tokenizer against the model's config: no more pieces than embeddings, and the
same [PAD] and [MASK] ids.

A hub id (no local folder) is checked once loaded (`load_checked`). `load_checked` loads with safetensors only and
refuses a model whose encoder weights are missing, of another shape, or left over (a config that does not
describe the weights): only a new task head may be initialised here.

A ground-floor module: it imports nothing from convattn.training or convattn.commands.
"""

from __future__ import annotations

import errno
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from convattn.errors import UsageError, listed
from convattn.files import check_weight_file
from convattn.runs.pretrain import RNG_STATE, TRAINER_STATE_FILES

CONFIG_FILE = "config.json"
PICKLED_WEIGHTS = ("pytorch_model.bin", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
# the JSON types of a config field's annotation (a bool is no number here)
JSON_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "None": (type(None),),
              "list": (list,), "tuple": (list,)}
JSON_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
                   type(None): "null"}
TORCH_DTYPES = ("float32", "bfloat16", "float16", "float64")


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


def known_convattn_fields(config_class) -> frozenset[str]:
    """The fields a convattn config.json may hold: those its class (`config_class`) and transformers' base config
    declare and write, and those configs saved by earlier versions hold."""
    from convattn.config import SAVED_BY_EARLIER_VERSIONS

    annotated = {name for cls in config_class.__mro__ for name in getattr(cls, "__annotations__", {})
                 if not name.startswith("_")}
    return frozenset(annotated | set(config_class().to_dict()) | SAVED_BY_EARLIER_VERSIONS)


def check_config_fields(data: dict, file: Path) -> None:
    """model_type is known; a convattn config holds only the fields of the class that reads it (the one registered
    for its model type: ConvAttnConfig)."""
    from transformers import CONFIG_MAPPING

    import convattn

    convattn.register_auto_classes()
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise UsageError(f"{file} has no \"model_type\"; a saved model's config names it (e.g. \"convattn\")")
    if model_type not in CONFIG_MAPPING:
        raise UsageError(f"{file}: model_type {model_type!r} is neither convattn nor a model type this transformers "
                         "knows")
    if model_type == "convattn":
        config_class = CONFIG_MAPPING[model_type]
        if unknown := sorted(set(data) - known_convattn_fields(config_class)):
            raise UsageError(f"{file} has fields convattn does not know: {', '.join(unknown)}; remove them (or use "
                             "the convattn version that wrote this model)")
        check_convattn_field_types(data, file, config_class)
    check_dtype(data, file)


def json_types(annotation: str) -> tuple[type, ...]:
    """The JSON types a field annotated `annotation` ("int | None", "list[str] | tuple[str, ...]") is saved as."""
    return tuple(kind for part in annotation.split("|") for kind in JSON_TYPES.get(part.strip().split("[")[0], ()))


def check_convattn_field_types(data: dict, file: Path, config_class) -> None:
    """Every field convattn writes is there, and each field `config_class` declares (beyond transformers' base
    config's) of the type it writes (a string where a list belongs would be read as one value; "false" as true)."""
    from dataclasses import fields

    from transformers import PretrainedConfig

    from convattn.config import ALWAYS_SAVED

    if missing := [field for field in ALWAYS_SAVED if field not in data]:
        raise UsageError(f"{file} lacks {', '.join(missing)}, which every convattn config holds; restore the file "
                         "(the one saved with the weights) or save the model again")
    base = {f.name for f in fields(PretrainedConfig)}
    for field in (f for f in fields(config_class) if f.name not in base):
        kinds = json_types(field.type if isinstance(field.type, str) else getattr(field.type, "__name__", ""))
        value = data.get(field.name)
        if field.name in data and kinds and not (isinstance(value, kinds) and (type(value) is not bool or
                                                                                 bool in kinds)):
            expected = " or ".join(dict.fromkeys(JSON_TYPE_NAMES[kind] for kind in kinds))
            raise UsageError(f"{file}: {field.name} must be {expected}; found {json.dumps(value)}; restore the file "
                             "(the one saved with the weights) or save the model again")


def check_dtype(data: dict, file: Path) -> None:
    """`dtype` (or its old name `torch_dtype`), when given, names a torch floating-point type."""
    for field in ("dtype", "torch_dtype"):
        if data.get(field) is not None and data[field] not in TORCH_DTYPES:
            raise UsageError(f"{file}: {field} {json.dumps(data[field])} is not a torch dtype; give one of "
                             f"{', '.join(TORCH_DTYPES)} (or remove the field)")


def token_id_fields(config) -> list[str]:
    """The special tokens' ids a config gives its model: every `*_token_id` field of a convattn config (its [PAD] and
    [MASK]), [PAD]'s of another (the one every transformers encoder embeds; its others are the tokenizer's concern)."""
    from convattn.meta_model import own_fields

    if config.model_type != "convattn":
        return ["pad_token_id"]
    return [name for name in own_fields(config) if name.endswith("_token_id")]


def check_token_ids(config, file: Path) -> None:
    """The special tokens the model embeds (`token_id_fields`) are inside its vocabulary."""
    vocab_size = getattr(config, "vocab_size", None)
    for field in token_id_fields(config):
        value = getattr(config, field, None)
        if isinstance(vocab_size, int) and value is not None and not (
                isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size):
            raise UsageError(f"{file}: {field} {value} is outside the vocabulary of {vocab_size:,} (ids 0 to "
                             f"{vocab_size - 1:,}); restore the file (the one saved with the tokenizer and weights)")


def load_config(folder: Path, data: dict):
    """The config object; a value the config class refuses is one line naming the file."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder)
    except (ValueError, TypeError, KeyError, OSError, ImportError, RuntimeError) as err:
        # (ImportError, RuntimeError: an attn_implementation that cannot run here, said by the config)
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


# ---------------------------------------------------------------------------------- the config against the weights
RESTORE = "restore config.json (the one saved with these weights)"


def check_weights_fit(config, shapes: dict[str, list[int]], file: Path) -> None:
    """The model `config` describes holds the tensors `shapes` (read from the safetensors headers: the model is built
    on the meta device, nothing is allocated), each of its shape; one line naming the field the weights contradict,
    else the tensors that differ."""
    from convattn import meta_model

    try:
        comparison = meta_model.compare(config, shapes)
    except (ValueError, TypeError, RuntimeError, OverflowError, AssertionError) as err:  # (the modules' refusals)
        message = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        if field := meta_model.field_too_large(config):  # a size past what even a meta tensor counts
            raise UsageError(f"{file}: {field} {getattr(config, field)} does not match the weights: the model it "
                             f"describes cannot be built ({message}); {RESTORE}") from None
        raise UsageError(f"{file}: {message}") from None  # the model's own refusal of this config
    if comparison.file_layers is not None:
        expected, held = config.num_hidden_layers, comparison.file_layers
        fact = ("the weights of the others fit no part of this model" if held > expected else
                "the config's other layers would have no weights")
        raise UsageError(f"{file}: num_hidden_layers {expected} does not match the weights, which hold {held} "
                         f"layers ({fact}); {RESTORE}")
    found = comparison.differences
    if not found:
        return
    field = meta_model.field_behind(comparison)
    if field is None:
        problems = described(sorted(found.missing), sorted(found.misshapen), sorted(found.extra))  # (as loading says)
        raise UsageError(f"{file.parent}: the weights do not match the config ({'; '.join(problems)}); is config.json "
                         "the one saved with these weights?")
    value = getattr(config, field)
    # said as the tables the field declares where the tensors it lacks or leaves over are at least as many as those of
    # another shape (ConvBERT's head_ratio), else as a size (a hidden_size that also adds the embeddings' projection)
    if len(found.missing) + len(found.extra) >= max(len(found.misshapen), 1):
        fact = (f"the file holds no {comparison.short(found.missing[0], numbered=True)}" if found.missing else
                f"the file holds {comparison.short(found.extra[0])}")
        raise UsageError(f"{file}: {field} {json.dumps(value)} does not describe the weights ({fact}); {RESTORE}")
    # the tensor named: the first with the fewest dimensions (a bias or a norm shows the size alone)
    name, in_file, in_model = min(found.misshapen, key=lambda tensor: len(tensor[2]))
    raise UsageError(f"{file}: {field} {value} does not match the weights: {comparison.short(name)} has shape "
                     f"{in_file} in the file but the config asks for {in_model}; {RESTORE}")


def check_tokenizer_fits(tokenizer, config, name: str) -> None:
    """The tokenizer saved with a model (`name`: how the user gave it) is the one it was trained with: no more pieces
    than embeddings (ids past them index out of range) and the config's special tokens' ids ([PAD], [MASK])."""
    embeddings = getattr(config, "vocab_size", None)
    if isinstance(embeddings, int) and len(tokenizer) > embeddings:
        raise UsageError(f"the tokenizer of {name} has {len(tokenizer):,} pieces, more than the model's "
                         f"{embeddings:,} embeddings (config.json vocab_size): save the tokenizer the model was "
                         "trained with beside it")
    for role in (field.removesuffix("_token_id") for field in token_id_fields(config)):
        ours, theirs = getattr(config, f"{role}_token_id", None), getattr(tokenizer, f"{role}_token_id", None)
        if ours is not None and theirs is not None and ours != theirs:
            raise UsageError(f"the tokenizer of {name} has its {role} token {getattr(tokenizer, f'{role}_token')!r} "
                             f"at id {theirs}, the model at {ours} (config.json {role}_token_id): save the tokenizer "
                             "the model was trained with beside it")


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
    say_unsure_rotary_terms(data, file)
    require_convattn(folder, need_convattn)
    check_token_ids(folder.config, file)
    shapes = {}
    for weights in weight_files(path):
        shapes |= check_weight_file(weights)
    check_weights_fit(folder.config, shapes, file)
    return folder


_SAID: set[Path] = set()


def say_unsure_rotary_terms(data: dict, file: Path) -> None:
    """Say on the screen, once a process, how a config that predates rotary_relative_terms is read where it changes
    the outputs (loading warns too, but a command sends the libraries' warnings to its log.txt)."""
    from convattn.config import unsure_rotary_terms
    from convattn.console import main_process

    if (note := unsure_rotary_terms(data)) and file.resolve() not in _SAID and main_process():
        _SAID.add(file.resolve())
        print(f"convattn: warning: {file}: {note}", file=sys.stderr, flush=True)


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
    return described(missing, mismatched, unexpected)


def described(missing: list[str], mismatched: list[tuple[str, list[int], list[int]]], unexpected: list[str]) \
        -> list[str]:
    """Weights missing from a file, of another shape ((name, the file's, the config's)), or left over, in words."""
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
        if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):  # a write (log.txt) failed: the disk's, said so
            raise
        message = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise UsageError(f"could not load the model from {source}: {message}") from None
    if problems := loading_problems(model, info, allow_new_head):
        raise UsageError(f"{source}: the weights do not match the config ({'; '.join(problems)}); is config.json "
                         "the one saved with these weights?")
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p.detach()).all()]
    if bad:
        raise UsageError(f"{source} holds non-finite (NaN or infinite) weights: {', '.join(bad[:3])}")
    return model
