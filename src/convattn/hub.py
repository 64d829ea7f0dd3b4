"""Sharing a saved run: its model card (README.md with Hub metadata) and `convattn push`."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import yaml

from convattn.errors import UsageError
from convattn.files import read_json, write_text_atomic
from convattn.runs.environment import changes, code_change, describe, recorded_environments
from convattn.runs.finetune import PUBLISHED_RECORD
from convattn.runs.pretrain import CHECKPOINTS, OPTIONS_FILE, TENSORBOARD, read_metrics

CARD = "README.md"
FINE_TUNED_RECORD = PUBLISHED_RECORD  # beside a model glue or squad published: its task, seed and dev scores
RUN_FILES = ("config.json", "model.safetensors")
# what a run folder holds that is not for the Hub (resumable state, logs are kept: metrics.jsonl, *.png)
NOT_UPLOADED = [f"{CHECKPOINTS}/*", f"{TENSORBOARD}/*", ".*"]
# the config fields a model card lists, in this order: the sizes, then the mechanism (a choice of what a reader
# compares models by, not every field; tests/test_hub.py holds them to ConvAttnConfig's fields)
CARD_SIZES = ("hidden_size", "embedding_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "vocab_size", "max_position_embeddings")
CARD_MECHANISM = ("position_embedding_type", "relative_terms", "relative_reach", "value_depthwise_conv",
                  "conv_projections", "head_ratio", "conv_kernel_size", "num_groups", "sequence_projection",
                  "linformer_k")


def _tags(config: dict, *extra: str) -> list[str]:
    return ["convattn", "custom_code", *extra] + ([config["preset"]] if config.get("preset") else [])


def _front_matter(metadata: dict) -> list[str]:
    """The card's Hub metadata block (YAML between --- lines), then a blank line."""
    return ["---", yaml.safe_dump(metadata, sort_keys=False).rstrip(), "---", ""]


def training_data(options: dict) -> str:
    """The pretraining text as the run's options name it."""
    if not options:
        return "not recorded"
    if options.get("dataset"):
        config = options.get("dataset_config")
        return f"{options['dataset']} (HuggingFace hub{f', {config}' if config else ''})"
    if options.get("train_files"):
        return ", ".join(options["train_files"])
    return "convattn's embedded default corpus (installed Python and library documentation)"


def _fine_tuned_usage(pipeline_tag: str, folder: Path) -> list[str]:
    """The card's usage lines: a text-classification pipeline, or (transformers has no question-answering
    pipeline) the QA model's `answer` method."""
    if pipeline_tag == "text-classification":
        return ["```python", "from transformers import pipeline",
                f'model = pipeline("text-classification", model={str(folder)!r}, trust_remote_code=True)', "```", ""]
    return [
        "```python",
        "from transformers import AutoModelForQuestionAnswering",
        f"model = AutoModelForQuestionAnswering.from_pretrained({str(folder)!r}, trust_remote_code=True)",
        'model.answer("Where did the dog run?", "The cat sat on the mat while the dog ran in the park.")',
        "# {'answer': ..., 'score': ..., 'start': ..., 'end': ...}",
        "```", "",
        "`answer` reads a long context in overlapping windows and returns the best span, its probability and its "
        "character offsets. `model(**inputs)` gives `start_logits` and `end_logits` as any question-answering "
        "model does (ELECTRA's joint head: the end given the most likely start) and, with the joint head, its beam "
        "of starts and ends (`start_top_index`, `end_top_index`) and the no-answer logit (`answerable_logits`).", "",
    ]


def fine_tuned_card(folder: str | os.PathLike, task: str, record: dict, pipeline_tag: str,
                    published_as: str | os.PathLike | None = None) -> Path:
    """README.md of a published fine-tuned model: the task, the seed and its dev scores, how to load it.
    `published_as`: the folder the card names, where `folder` (a staging folder) is moved once written."""
    folder = Path(folder)
    published = Path(published_as or folder)
    config = read_json(folder / "config.json") or {}
    scores = {name: value for name, value in record.get("scores", {}).items() if isinstance(value, int | float)}
    metadata = {
        "library_name": "transformers", "pipeline_tag": pipeline_tag,
        "tags": _tags(config, task),
        "model-index": [{"name": published.name, "results": [{
            "task": {"type": pipeline_tag, "name": task},
            "metrics": [{"type": name, "name": f"dev {name}", "value": value} for name, value in scores.items()],
        }]}],
    }
    lines = [
        *_front_matter(metadata),
        f"# {task}: {published.name}", "",
        f"Fine-tuned with convattn on {task} (seed {record.get('seed')}, the best of the run's seeds on dev), from "
        f"`{record.get('model', 'a pretrained encoder')}`.", "",
        "## Dev scores", "",
        *(f"- {name}: {value:.2f}" for name, value in scores.items()), "",
        "## Usage", "",
        *_fine_tuned_usage(pipeline_tag, published),
    ]
    path = folder / CARD
    write_text_atomic(path, "\n".join(lines))
    return path


def model_card(run_dir: str | os.PathLike, repo_id: str | None = None) -> str:
    """The README.md text of a saved run, from its config.json, pretrain_options.json and metrics.jsonl."""
    run = Path(run_dir)
    config = read_json(run / "config.json") or {}
    if not config:
        raise FileNotFoundError(f"{run} has no config.json: not a saved convattn model")
    options = read_json(run / OPTIONS_FILE) or {}
    rows = read_metrics(run)
    final = rows[-1] if rows else {}
    data = training_data(options)
    architecture = (config.get("architectures") or ["ConvAttnForMaskedLM"])[0]
    metadata = {
        "library_name": "transformers",
        "pipeline_tag": "fill-mask" if architecture.endswith("MaskedLM") else None,
        "tags": _tags(config),
        "datasets": [options["dataset"]] if options.get("dataset") else None,
    }
    if final.get("perplexity") is not None:
        metadata["model-index"] = [{"name": repo_id or run.name, "results": [{
            "task": {"type": "fill-mask", "name": "Masked language modelling"},
            "metrics": [{"type": "perplexity", "name": "eval perplexity", "value": final["perplexity"]}],
        }]}]
    metadata = {k: v for k, v in metadata.items() if v is not None}
    name = repo_id or str(run)
    shown = {k: config[k] for k in CARD_SIZES + CARD_MECHANISM if k in config}
    lines = [
        *_front_matter(metadata),
        f"# {Path(name).name}", "",
        f"A BERT-style encoder with convolution-augmented attention, trained with "
        f"convattn (preset `{config.get('preset') or 'custom'}`, `{architecture}`).", "",
        "## Model", "",
        *(f"- `{k}`: {json.dumps(v)}" for k, v in shown.items()), "",
        "## Training", "",
        f"- data: {data}",
        f"- steps: {final.get('step', options.get('max_steps', 'not recorded'))}",
        f"- tokens seen: {final['tokens_seen']:,}" if final.get("tokens_seen") else "- tokens seen: not recorded",
        f"- eval perplexity: {final['perplexity']}" if final.get("perplexity") is not None
        else "- eval perplexity: not recorded",
        *environment_lines(run), "",
        "## Usage", "",
        "The modeling code is saved with the weights, so convattn need not be installed:", "",
        "```python",
        "from transformers import pipeline",
        f'fill = pipeline("fill-mask", model="{name}", trust_remote_code=True)',
        'fill(f"The capital of France is {fill.tokenizer.mask_token}.")',
        "```", "",
    ]
    return "\n".join(lines)


def environment_lines(run: Path) -> list[str]:
    """The card's lines on what the run trained on: its first start's environment, then each resume's that
    changed a setting or the code (runs from before environment.jsonl: none)."""
    entries = recorded_environments(run)
    if not entries:
        return []
    lines = [f"- trained on: {describe(entries[0])}"]
    for before, entry in itertools.pairwise(entries):
        if changes(before, entry) or code_change(before, entry):
            lines.append(f"- from step {entry.get('step', 0):,} (resumed): {describe(entry)}")
    return lines


def write_model_card(run_dir: str | os.PathLike, repo_id: str | None = None) -> Path:
    """Write (or rewrite) the run's README.md, atomically."""

    path = Path(run_dir) / CARD
    write_text_atomic(path, model_card(run_dir, repo_id))
    return path


def push(run_dir: str | os.PathLike, repo_id: str, *, private: bool = False, token: str | None = None) -> str:
    """Upload a saved run to the Hub (model, tokenizer, modeling code, card, metrics); returns the commit URL."""
    from huggingface_hub import HfApi

    run = Path(run_dir)
    missing = [f for f in RUN_FILES if not (run / f).exists()]
    if missing:
        raise FileNotFoundError(f"{run} is not a saved model: missing {', '.join(missing)}")
    if not any(run.glob("convattn_*.py")):
        raise FileNotFoundError(f"{run} has no modeling code (convattn_*.py): save it again with this convattn")
    api = HfApi(token=token)
    card = run / CARD
    local_card = card.read_text() if card.is_file() else None
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if not (run / FINE_TUNED_RECORD).is_file():  # a fine-tuned model keeps the card naming its task
            write_model_card(run, repo_id)  # the card names the repository it is uploaded to
        commit = api.upload_folder(folder_path=str(run), repo_id=repo_id, repo_type="model",
                                   ignore_patterns=NOT_UPLOADED, commit_message="Upload convattn model")
    except Exception as err:
        if local_card is not None:  # nothing changes locally unless the upload happened
            write_text_atomic(card, local_card)
        if is_network_error(err):
            raise UsageError(f"cannot reach the Hugging Face Hub to push {repo_id} ({type(err).__name__}); "
                                  "check the network and `hf auth login`, then push again") from None
        raise
    return str(getattr(commit, "commit_url", commit))


def is_network_error(err: BaseException) -> bool:
    """No connection, offline mode or an HTTP error from the Hub (not a bug of ours)."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    seen = err
    while seen is not None:
        if isinstance(seen, HfHubHTTPError | OfflineModeIsEnabled | ConnectionError | TimeoutError) or \
                type(seen).__module__.startswith(("requests", "urllib3", "httpx", "httpcore")):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
