"""A tampered or mismatched model folder is refused by every command that reads one (glue, squad, export, plot
attention) before anything is built from it or written: one line naming the field, exit 2, the output folder and
the model folder byte for byte as they were. Sizes are read from the safetensors headers, so a size of 10^9 is a
line, not an allocation of terabytes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest
from helpers.damage import config_with, config_without, integer_weight, swap_tokens
from helpers.tiny import save_tiny_checkpoint, tiny_wordpiece_tokenizer

from convattn.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SENTENCES = ["a dog runs in the park .", "the cat sat on the mat .", "where does the river elm rise ?",
             "the bridge at harlow has nine arches ."] * 40
COMMANDS = {
    "glue": lambda model, out: ["glue", "--model", str(model), "--output-dir", str(out), "--task", "sst2",
                                "--data-dir", str(FIXTURES / "glue_data"), "--seeds", "1", "--max-steps", "2"],
    "squad": lambda model, out: ["squad", "--model", str(model), "--output-dir", str(out), "--version", "1.1",
                                 "--train-file", str(FIXTURES / "squad" / "train-v1.1.json"), "--dev-file",
                                 str(FIXTURES / "squad" / "dev-v1.1.json"), "--seeds", "1", "--max-steps", "2",
                                 "--max-length", "48", "--doc-stride", "16", "--max-query-length", "12"],
    "export": lambda model, out: ["export", str(model), "--onnx", str(out / "model.onnx")],
    "plot": lambda model, out: ["plot", "attention", str(model), "--output-dir", str(out)],
}
ALL = tuple(COMMANDS)
WITH_TOKENIZER = ("glue", "squad", "plot")  # export writes the encoder alone
HUGE = 10**9


def larger_tokenizer(folder: Path) -> None:
    """The model's tokenizer with one piece more than the model has embeddings."""
    vocab_size = json.loads((folder / "config.json").read_text())["vocab_size"]
    tokenizer = tiny_wordpiece_tokenizer(SENTENCES)
    tokenizer.add_tokens([f"extra{i}" for i in range(vocab_size + 1 - len(tokenizer))])
    tokenizer.save_pretrained(folder)


def trainer_state_only(folder: Path) -> None:
    """A checkpoint folder whose model.safetensors is gone: the Trainer's arguments and optimizer state remain."""
    (folder / "model.safetensors").unlink()
    for name in ("training_args.bin", "optimizer.pt"):
        (folder / name).write_bytes(b"not loaded")


def shard_index(folder: Path, weight_map, *, folder_shard: bool = False) -> None:
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    if folder_shard:
        (folder / "model-2.safetensors").mkdir()


# (case, damage, the line's words naming the field, the commands that read what was damaged)
CASES = [
    ("relative_reach of 10^9", lambda f: config_with(f, relative_reach=HUGE),
     f"relative_reach {HUGE} does not match the weights", ALL),
    ("hidden_size of 10^9", lambda f: config_with(f, hidden_size=HUGE), f"hidden_size {HUGE} does not match", ALL),
    ("vocab_size of 10^9", lambda f: config_with(f, vocab_size=HUGE), f"vocab_size {HUGE} does not match", ALL),
    ("more layers than the weights", lambda f: config_with(f, num_hidden_layers=3),
     "num_hidden_layers 3 does not match the weights, which hold 2 layers", ALL),
    ("bogus dtype", lambda f: config_with(f, dtype="float77"), 'dtype "float77" is not a torch dtype; give one of',
     ALL),
    ("pad id past the vocabulary", lambda f: config_with(f, pad_token_id=HUGE),
     f"pad_token_id {HUGE} is outside the vocabulary", ALL),
    ("mask id past the vocabulary", lambda f: config_with(f, mask_token_id=HUGE),
     f"mask_token_id {HUGE} is outside the vocabulary", ALL),
    ("no model_type", lambda f: config_without(f, "model_type"), 'has no "model_type"', ALL),
    ("a missing field", lambda f: config_without(f, "hidden_size"), "lacks hidden_size, which every convattn config",
     ALL),
    ("a string for a list", lambda f: config_with(f, relative_terms="fixed"), 'relative_terms must be a list; found '
     '"fixed"', ALL),
    ("a string for a bool", lambda f: config_with(f, value_depthwise_conv="false"),
     "value_depthwise_conv must be true or false", ALL),
    ("tables the config does not declare", lambda f: config_with(f, relative_terms=[]),
     "relative_terms [] does not describe the weights (the file holds encoder.layer.0.attention.self.relative.fixed)",
     ALL),
    ("a table the file lacks", lambda f: config_with(f, relative_terms=["fixed", "dynamic_query", "dynamic_key"]),
     "does not describe the weights (the file holds no encoder.layer.N.attention.self.relative.key_kernel)", ALL),
    ("an unknown attn_implementation", lambda f: config_with(f, attn_implementation="flash"),
     "attn_implementation='flash' is not allowed; choose one of 'sdpa', 'eager'", ALL),
    ("[PAD] and [UNK] swapped in the tokenizer", lambda f: swap_tokens(f, "[PAD]", "[UNK]"),
     "its pad token '[PAD]' at id 1, the model at 0 (config.json pad_token_id)", WITH_TOKENIZER),
    ("a [MASK] id other than the config's", lambda f: config_with(f, mask_token_id=7),
     "its mask token '[MASK]' at id 4, the model at 7 (config.json mask_token_id)", WITH_TOKENIZER),
    ("a tokenizer one piece larger", larger_tokenizer, "more than the model's", WITH_TOKENIZER),
    ("an integer weight", integer_weight, "model.safetensors: the weight convattn.encoder.layer.0.output.dense.weight "
     "is int32, not a floating-point type, which loading would cast without a word; save the model from its "
     "floating-point weights", ALL),
    # the folder check every command shares, through one command (mutation round 31)
    ("an empty model_type", lambda f: config_with(f, model_type=""), 'has no "model_type"', ("plot",)),
    ("NaN inside a list", lambda f: config_with(f, relative_terms=["fixed", math.nan]),
     "relative_terms[1] must be a finite number", ("plot",)),
    ("true for a size", lambda f: config_with(f, hidden_size=True), "hidden_size must be an integer; found true",
     ("plot",)),
    ("true for a token id", lambda f: config_with(f, pad_token_id=True), "pad_token_id must be an integer or null; "
     "found true", ("plot",)),
    ("a bogus torch_dtype (the old name)", lambda f: config_with(f, torch_dtype="float77"),
     'torch_dtype "float77" is not a torch dtype', ("plot",)),
    ("a checkpoint holding only the trainer's state", trainer_state_only,
     "is a training checkpoint without its model.safetensors", ("plot",)),
    ("a shard the index lists that is a folder",
     lambda f: shard_index(f, {"w": "model-2.safetensors"}, folder_shard=True),
     "lacks the weight shards model-2.safetensors listed in model.safetensors.index.json", ("plot",)),
    ("an index whose weight_map is a list", lambda f: shard_index(f, ["model.safetensors"]),
     'is not a safetensors index (JSON with a "weight_map")', ("plot",)),
]


def hashes(folder: Path) -> dict[str, str] | None:
    """sha256 of every file under `folder` by its relative path (None: no folder)."""
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("saved") / "model", SENTENCES)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(("command", "damage", "message"), [
    pytest.param(command, damage, message, id=f"{command}: {case}")
    for case, damage, message, commands in CASES for command in commands])
def test_a_bad_model_folder_is_one_line_with_nothing_written(saved, tmp_path, capsys, command, damage, message):
    if command == "export" and not (importlib.util.find_spec("onnx") and importlib.util.find_spec("onnxscript")):
        pytest.skip("export needs the [onnx] extra")
    model, out = Path(shutil.copytree(saved, tmp_path / "model")), tmp_path / "out"
    out.mkdir()  # (export's file goes into a folder that exists)
    damage(model)
    before = hashes(model), hashes(out)
    code = main(COMMANDS[command](model, out))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith(f"convattn {command}: error: ") and "\n" not in err, err
    assert message in err, err
    assert (hashes(model), hashes(out)) == before


def test_pretrain_refuses_a_tokenizer_whose_mask_is_its_unknown_piece(saved, tmp_path, capsys):
    tokenizer = Path(shutil.copytree(saved, tmp_path / "tokenizer"))
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({**config, "mask_token": "[UNK]"}))
    (tmp_path / "corpus.txt").write_text("\n".join(SENTENCES))
    out = tmp_path / "out"
    code = main(["pretrain", "--tokenizer", str(tokenizer), "--train-file", str(tmp_path / "corpus.txt"),
                 "--output-dir", str(out), "--max-steps", "2"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and err.startswith("convattn pretrain: error: --tokenizer "), err
    assert "the tokenizer's mask and unk tokens are the same piece (id 1); each needs its own" in err
    assert not out.exists()
