"""The pretrained model a fine-tuning run starts from, checked before anything is written: its folder and
tokenizer, the input length its positions allow, and (`check_same_model`) that an output folder's finished runs
came from this same model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from convattn.checkpoint import ModelFolder, check_model_folder, check_tokenizer_fits
from convattn.console import say
from convattn.errors import UsageError, option
from convattn.files import model_identity, read_json, write_json_atomic
from convattn.runs.folder import check_own_folder
from convattn.training.finetune.recipes import BASE_HIDDEN_SIZE
from convattn.training.finetune.trainer import RUN_FILE

# transformers models whose position ids start after the padding index: pad_token_id + 1 positions are unusable
OFFSET_POSITION_MODELS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm",
                          "data2vec-text", "ibert", "mpnet", "longformer")


@dataclass(frozen=True)
class PretrainedModel:
    folder: ModelFolder
    tokenizer: PreTrainedTokenizerBase
    base_size: bool           # wide enough for the recipe's base-size settings
    token_types: bool         # takes token type ids
    input_limit: int | None   # the longest input its positions allow; None: any length

    @property
    def source(self) -> str:
        return self.folder.source


def input_limit(config) -> int | None:
    """The longest input the model takes: convattn says it (None for relative-only models); other transformers
    models are bounded by max_position_embeddings when they have it."""
    if config.model_type == "convattn":
        return config.max_input_length
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int):
        return None
    if config.model_type in OFFSET_POSITION_MODELS and getattr(config, "pad_token_id", None) is not None:
        positions -= config.pad_token_id + 1
    return positions


def load_pretrained(model: str, command: str, foreign_use: str) -> PretrainedModel:
    """The checked model folder (or hub model) and its tokenizer. A model that is not convattn's is said in one
    line (`foreign_use`: what is done with it)."""
    folder = check_model_folder(model)
    if not folder.is_convattn:
        say(command, folder.foreign_note(foreign_use))
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError, TypeError) as err:
        message = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise UsageError(f"could not load a tokenizer from {model!r} ({message}); save the tokenizer with the "
                         "model (tokenizer.save_pretrained)") from None
    config = folder.config
    check_tokenizer_fits(tokenizer, config, f"{option('model')} {model}")
    return PretrainedModel(folder, tokenizer, base_size=getattr(config, "hidden_size", 0) >= BASE_HIDDEN_SIZE,
                           token_types=getattr(config, "type_vocab_size", 0) > 1, input_limit=input_limit(config))


def fitted_max_length(max_length: int, given: bool, pretrained: PretrainedModel, command: str) -> int:
    """`max_length` within the model's positions: refused when given on the command line, lowered (and said)
    when it is the recipe's."""
    limit = pretrained.input_limit
    if limit is None or max_length <= limit:
        return max_length
    if given:
        raise UsageError(f"{option('max_length')} {max_length} exceeds the {limit} positions of "
                         f"{pretrained.source}; give "
                         f"{option('max_length')} {limit} or less")
    say(command, f"the recipe's max length {max_length} exceeds the {limit} positions of {pretrained.source}; "
                 f"using {limit}")
    return limit


def check_same_model(output_dir: Path, model: str, record_file: str) -> str:
    """Finished runs are reused only for the model that made them (weights + config, not the folder's name):
    `record_file` records it, written before the first run. Returns its fingerprint (`check_unchanged`)."""
    record = {"model": model, "identity": model_identity(model)}
    saved = read_record(output_dir / record_file)
    if saved is not None and saved.get("identity") == record["identity"]:
        return record["identity"]
    if saved is None:
        check_own_folder(output_dir, (record_file,))
    elif finished := sorted(output_dir.glob(f"runs/*/seed*/{RUN_FILE}")):
        raise UsageError(f"{output_dir} holds {len(finished)} finished run(s) of another model "
                         f"({saved.get('model')}, fingerprint {saved.get('identity')}; {model} is "
                         f"{record['identity']}); use another {option('output_dir')}")
    # (a record without finished runs was left by a job that stopped before any: it is replaced)
    write_json_atomic(output_dir / record_file, record)
    return record["identity"]


def read_record(file: Path) -> dict | None:
    """A model record (None: none), one line naming it when damaged."""
    try:
        saved = read_json(file)
    except ValueError:
        saved = []
    if saved is not None and not isinstance(saved, dict):
        raise UsageError(f"{file} is damaged or not written by convattn (not a JSON object); delete it, or use "
                         f"another {option('output_dir')}")
    return saved


def check_unchanged(model: str, identity: str | None) -> None:
    """`model` still has the fingerprint the job recorded (checked once a seed has loaded it): a folder rewritten
    meanwhile (a `pretrain --resume` finishing there) would put two models in one table. None: a model this job
    made (MNLI's, for the tasks that start from it), nothing to check."""
    if identity is not None and (now := model_identity(model)) != identity:
        raise UsageError(f"{option('model')} {model} changed while this job ran (fingerprint {identity}, now {now}); "
                         f"the seeds finished before are kept; fine-tune the new model into another "
                         f"{option('output_dir')}")
