"""`convattn glue` and `convattn squad` refuse what they cannot do well, in one line and exit 2 with nothing written:
impossible values, model folders that are not what they claim, busy or impossible output folders; and training
that diverges stops at once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.damage import config_with, nan_weights, pickle_only
from helpers.tiny import save_tiny_checkpoint, tiny_wordpiece_tokenizer
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertForMaskedLM

from convattn.cli import main
from convattn.runs.folder import run_folder_lock

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GLUE_DATA = FIXTURES / "glue_data"
SQUAD = FIXTURES / "squad"
SENTENCES = ["a dog runs in the park .", "the cat sat on the mat .", "where does the river elm rise ?",
             "the bridge at harlow has nine arches ."] * 40
GLUE_QUICK = ["--task", "sst2", "--data-dir", str(GLUE_DATA), "--seeds", "1", "--max-steps", "2", "--batch-size", "8"]
SQUAD_QUICK = ["--version", "1.1", "--train-file", str(SQUAD / "train-v1.1.json"), "--dev-file",
               str(SQUAD / "dev-v1.1.json"), "--seeds", "1", "--max-steps", "2", "--batch-size", "4",
               "--max-length", "48", "--doc-stride", "16", "--max-query-length", "12"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny relative-position (composite) checkpoint: no limit on the input length."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("relative"), SENTENCES)


@pytest.fixture(scope="module")
def absolute_checkpoint(tmp_path_factory) -> Path:
    """A tiny checkpoint with absolute position embeddings (128 positions)."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("absolute"), SENTENCES, preset="chang2021-small/absolute")


def run(command: str, model: Path, out: Path, *extra: str) -> int:
    quick = GLUE_QUICK if command == "glue" else SQUAD_QUICK
    return main([command, "--model", str(model), "--output-dir", str(out), *quick, *extra])


def assert_one_line_exit_2(code: int, err: str, command: str, *fragments: str) -> None:
    last = err.strip().splitlines()[-1] if err.strip() else ""
    assert code == 2, err
    assert last.startswith(f"convattn {command}: error: "), err
    assert "Traceback" not in err and "unexpected error" not in err
    for fragment in fragments:
        assert fragment in last, (fragment, last)


BAD_VALUES = {
    "glue": [
        (["--layer-decay", "nan"], "--layer-decay nan must be a number in (0, 1]"),
        (["--layer-decay", "-1"], "--layer-decay -1.0 must be a number in (0, 1]"),
        (["--layer-decay", "1.5"], "--layer-decay 1.5 must be"),
        (["--weight-decay", "nan"], "--weight-decay nan must be a finite number >= 0"),
        (["--weight-decay", "-1"], "--weight-decay -1.0 must be"),
        (["--lr", "inf"], "--lr inf must be a finite number > 0"),
        (["--lr", "1e400"], "--lr inf must be"),
        (["--lr", "0"], "--lr 0.0 must be"),
        (["--warmup-ratio", "nan"], "--warmup-ratio nan must be a fraction in [0, 1)"),
        (["--max-train-samples", "0"], "--max-train-samples 0 must be an integer >= 1"),
        (["--batch-size", "0"], "--batch-size 0 must be"),
        (["--max-steps", "-3"], "--max-steps -3 must be"),
        (["--max-steps", "100000000000000"], "--max-steps 100000000000000 must be an integer from 1 to 1,000,000,000"),
        (["--max-length", "1"], "--max-length 1 leaves no room for the text: give at least"),
        (["--max-length", "0"], "--max-length 0 must be"),
        (["--task-lr", "sst2=nan"], "--task-lr sst2=nan"),
        (["--task-lr", "mrpc=1e-4"], "--task-lr mrpc=0.0001: mrpc is not fine-tuned in this job; give it for one of "
                                     "the tasks run (sst2), or add mrpc to --task"),
        (["--seeds", "0"], "--seeds 0 must be"),
    ],
    "squad": [
        (["--layer-decay", "nan"], "--layer-decay nan must be"),
        (["--weight-decay", "inf"], "--weight-decay inf must be"),
        (["--doc-stride", "1000"], "--doc-stride 1000 must be at most 33"),
        (["--doc-stride", "0"], "--doc-stride 0 must be"),
        (["--max-length", "8"], "--max-length 8 leaves no room for a context"),
        (["--max-query-length", "0"], "--max-query-length 0 must be"),
        (["--n-best", "0"], "--n-best 0 must be"),
        (["--max-answer-length", "-1"], "--max-answer-length -1 must be"),
        (["--version", "2.0", "--train-file", str(SQUAD / "train-v1.1.json"), "--dev-file",
          str(SQUAD / "dev-v1.1.json")], "is a SQuAD 1.1 file"),
    ],
}


@pytest.mark.parametrize(("command", "extra", "message"),
                         [(command, extra, message) for command, cases in BAD_VALUES.items()
                          for extra, message in cases])
def test_bad_values_are_one_line_with_nothing_written(checkpoint, tmp_path, capsys, command, extra, message):
    out = tmp_path / "out"
    code = run(command, checkpoint, out, *extra)
    assert_one_line_exit_2(code, capsys.readouterr().err, command, message)
    assert not out.exists()


@pytest.mark.parametrize("command", ["glue", "squad"])
def test_max_length_past_absolute_positions(absolute_checkpoint, checkpoint, tmp_path, capsys, command):
    code = run(command, absolute_checkpoint, tmp_path / "out", "--max-length", "100000")
    assert_one_line_exit_2(code, capsys.readouterr().err, command, "--max-length 100000 exceeds the 128 positions")
    assert not (tmp_path / "out").exists()
    if command == "squad":  # a relative-only model takes any length
        assert run(command, checkpoint, tmp_path / "relative", "--max-length", "100000") == 0


def test_the_recipes_max_length_is_lowered_to_the_models_positions(absolute_checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["squad", "--model", str(absolute_checkpoint), "--output-dir", str(out),
                 *[a for a in SQUAD_QUICK if a not in ("--max-length", "48")]]) == 0
    assert "the recipe's max length 512 exceeds the 128 positions" in capsys.readouterr().err
    run_file = json.loads((out / "runs" / "squad1.1" / "seed0" / "run.json").read_text())
    assert run_file["settings"]["max_length"] == 128


def test_the_recipes_doc_stride_is_lowered_to_fit_a_short_window(checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["squad", "--model", str(checkpoint), "--output-dir", str(out),
                 *[a for a in SQUAD_QUICK if a not in ("--doc-stride", "16")]]) == 0
    assert "the recipe's doc stride 128 exceeds the 33 context tokens a window holds" in capsys.readouterr().err
    assert json.loads((out / "runs" / "squad1.1" / "seed0" / "run.json").read_text())["settings"]["doc_stride"] == 33


@pytest.mark.parametrize("command", ["glue", "squad"])
def test_divergence_stops_at_the_first_non_finite_loss(checkpoint, tmp_path, capsys, command):
    code = run(command, checkpoint, tmp_path / "out", "--lr", "1e30", "--max-steps", "4")
    assert_one_line_exit_2(code, capsys.readouterr().err, command, "training stopped at step", "lower --lr")
    assert not list((tmp_path / "out").glob("**/run.json"))


def copy_of(checkpoint: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(checkpoint, tmp_path / "model"))


def bert_config_over_convattn_weights(folder: Path) -> None:
    BertConfig(vocab_size=len(tiny_wordpiece_tokenizer(SENTENCES)), hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=64).save_pretrained(folder)


def larger_tokenizer(folder: Path) -> None:
    """A tokenizer with more pieces than the model has embeddings (ids past them would index out of range)."""
    words = [f"word{i} extra{i}" for i in range(400)]
    tiny_wordpiece_tokenizer(SENTENCES + words, vocab_size=2000).save_pretrained(folder)


def trainer_state_only(folder: Path) -> None:
    """A checkpoint whose model.safetensors is gone: the Trainer's pickles are not weights to convert."""
    (folder / "model.safetensors").unlink()
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"state": 1}, folder / name)


BAD_FOLDERS = [
    (nan_weights, "non-finite (NaN or infinite) weights"),
    (lambda f: config_with(f, hidden_dropout_prob=float("nan")), "hidden_dropout_prob must be a finite"),
    (lambda f: config_with(f, typo_field=3), "fields convattn does not know: typo_field"),
    (lambda f: (f / "config.json").write_text("{oops"), "is not JSON"),
    (pickle_only, "safetensors only"),
    (lambda f: (f / "model.safetensors").write_bytes(b""), "truncated or corrupt"),
    (lambda f: config_with(f, intermediate_size=48), "has shape [64] in the file but the config asks for [48]"),
    (bert_config_over_convattn_weights, "weights are missing from the file"),
    (larger_tokenizer, "more than the model's"),
    (trainer_state_only, "is a training checkpoint without its model.safetensors (it holds only the trainer's "
                         "state: optimizer.pt, rng_state.pth"),
]


@pytest.mark.parametrize("command", ["glue", "squad"])
@pytest.mark.parametrize(("damage", "message"), BAD_FOLDERS)
def test_bad_model_folders_are_refused(checkpoint, tmp_path, capsys, command, damage, message):
    folder = copy_of(checkpoint, tmp_path)
    damage(folder)
    code = run(command, folder, tmp_path / "out", "--max-steps", "2")
    assert_one_line_exit_2(code, capsys.readouterr().err, command, message)
    assert not list((tmp_path / "out").glob("**/run.json"))


@pytest.fixture(scope="module")
def bert_checkpoint(tmp_path_factory) -> Path:
    """A plain transformers BERT with a tokenizer: not convattn's, still fine-tunable."""
    path = tmp_path_factory.mktemp("bert")
    tokenizer = tiny_wordpiece_tokenizer(SENTENCES)
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=64)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("command", ["glue", "squad"])
def test_another_architecture_fine_tunes_and_says_so(bert_checkpoint, tmp_path, capsys, command):
    assert main([command, "--model", str(bert_checkpoint), "--output-dir", str(tmp_path / "out"),
                 *(GLUE_QUICK if command == "glue" else SQUAD_QUICK)]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "not a convattn model" in line]
    assert len(notes) == 1 and "is a transformers bert model" in notes[0]


@pytest.mark.parametrize("command", ["glue", "squad"])
def test_a_busy_output_dir_is_refused(checkpoint, tmp_path, capsys, command):
    out = tmp_path / "out"
    with run_folder_lock(out):  # another run holds it
        code = run(command, checkpoint, out)
    assert_one_line_exit_2(code, capsys.readouterr().err, command, "is in use by another convattn run")
    assert not out.exists()  # the holder wrote nothing, so its lock left no trace


@pytest.mark.parametrize("command", ["glue", "squad"])
def test_an_output_dir_that_is_a_file_is_refused(checkpoint, tmp_path, capsys, command):
    (tmp_path / "file").write_text("mine")
    code = run(command, checkpoint, tmp_path / "file")
    assert_one_line_exit_2(code, capsys.readouterr().err, command, "is a file")
    code = run(command, checkpoint, tmp_path / "file" / "sub")
    assert_one_line_exit_2(code, capsys.readouterr().err, command, "is a file")
    assert (tmp_path / "file").read_text() == "mine"
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    code = run(command, checkpoint, tmp_path / "dangling")
    assert_one_line_exit_2(code, capsys.readouterr().err, command, "is a symbolic link to nothing")


@pytest.mark.parametrize("command", ["glue", "squad"])
def test_fewer_seeds_than_a_folder_holds_are_refused(checkpoint, tmp_path, capsys, command):
    """The results average every finished seed: --seeds 1 into a folder of 2 would report 2."""
    out = tmp_path / "out"
    assert run(command, checkpoint, out, "--seeds", "2") == 0
    results = {path: path.read_bytes() for path in out.glob("*_results.*")}
    capsys.readouterr()
    code = run(command, checkpoint, out, "--seeds", "1")
    assert_one_line_exit_2(code, capsys.readouterr().err, command, "--seeds 1: ", "also holds finished seed(s) 1",
                           "give --seeds 2 or another --output-dir")
    assert results and {path: path.read_bytes() for path in out.glob("*_results.*")} == results


def glue_data_with(tmp_path: Path, train_tsv: bytes) -> Path:
    """The fixture's glue_data with SST-2's train.tsv replaced."""
    data = Path(shutil.copytree(GLUE_DATA, tmp_path / "glue_data"))
    (data / "SST-2" / "train.tsv").write_bytes(train_tsv)
    return data


BAD_GLUE_DATA = [  # (SST-2 train.tsv, the line's fragments): found before anything is written
    (b"sentence\tlabel\ncaf\xe9 au lait\t1\n", ["train.tsv:2: not UTF-8 (byte 0xe9)", "iconv -f latin1"]),
    ("sentence\tlabel\nhello world\t1\n".encode("utf-16"), ["train.tsv: UTF-16 text, not UTF-8",
                                                          "iconv -f UTF-16 -t UTF-8 train.tsv"]),
    (b"sentence\tlabel\nhello world\tabc\n", ["train.tsv:2: unknown sst2 label 'abc'"]),
    (b"sentence\tlabel\nhello world\t1\n \t0\n", ["train.tsv:3: the sentence is empty, so there is nothing to "
                                                   "classify; remove the row or fill it in"]),
    (b"sentence\tlabel\nhello\tworld\t1\n", ["train.tsv:2: 3 tab-separated columns, expected 2"]),
    (b"sentence\tlabel\n", ["train.tsv has no data rows"]),
]


@pytest.mark.parametrize(("train_tsv", "fragments"), BAD_GLUE_DATA)
def test_bad_glue_files_are_refused_before_anything_is_written(checkpoint, tmp_path, capsys, train_tsv, fragments):
    out = tmp_path / "out"
    code = run("glue", checkpoint, out, "--data-dir", str(glue_data_with(tmp_path, train_tsv)))
    assert_one_line_exit_2(code, capsys.readouterr().err, "glue", *fragments)
    assert not out.exists()  # no glue_model.json, no log.txt: a later run of another model is not refused


@pytest.mark.parametrize("command", ["glue", "squad"])
def test_a_hub_id_without_the_hub_is_one_line(tmp_path, capsys, command):
    code = run(command, "no-such-org/no-such-model", tmp_path / "out")
    err = capsys.readouterr().err
    assert_one_line_exit_2(code, err, command, "no-such-org/no-such-model", "the hub does not answer",
                           "give a local model folder")
    assert len(err.strip().splitlines()) == 1  # no retry lines before it
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["glue", "squad"])
def test_a_loss_that_is_not_finite_before_any_update_does_not_blame_the_learning_rate(checkpoint, tmp_path, capsys,
                                                                                       command):
    folder = copy_of(checkpoint, tmp_path)
    weights = load_file(folder / "model.safetensors")
    save_file({name: tensor * 1e30 for name, tensor in weights.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    code = run(command, folder, tmp_path / "out")
    assert_one_line_exit_2(code, capsys.readouterr().err, command, "training stopped at step 1: the loss is nan before "
                           "any update, so the learning rate is not the cause", "the starting model's weights")
    assert not list((tmp_path / "out").glob("**/run.json"))


@pytest.mark.parametrize("command", ["glue", "squad"])
def test_a_model_record_without_finished_runs_is_replaced(checkpoint, tmp_path, capsys, command):
    """A record an earlier version left when it refused a job (no run finished) names no runs to keep apart."""
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{command}_model.json").write_text(json.dumps({"model": "other", "identity": "0123456789abcdef"}))
    (out / "log.txt").write_text("")
    assert run(command, checkpoint, out) == 0
    assert json.loads((out / f"{command}_model.json").read_text())["model"] == str(checkpoint)
    capsys.readouterr()
    other = copy_of(checkpoint, tmp_path)
    config_with(other, hidden_dropout_prob=0.05)  # another fingerprint
    assert run(command, other, out) == 2
    assert "holds 1 finished run(s) of another model" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["glue", "squad"])
def test_a_model_saved_again_in_its_folder_is_another_model(checkpoint, tmp_path, capsys, command):
    """Finished runs are kept apart by the model's fingerprint, not its folder's name: a folder another model was
    saved into (a pretraining run resumed and finished there) is another model."""
    model, out = copy_of(checkpoint, tmp_path), tmp_path / "out"
    assert run(command, model, out) == 0
    config_with(model, hidden_dropout_prob=0.05)  # the same folder, another fingerprint
    capsys.readouterr()
    assert run(command, model, out) == 2
    assert "holds 1 finished run(s) of another model" in capsys.readouterr().err


def test_a_finished_seed_of_another_precision_is_named_by_its_option_not_a_dump_of_the_settings(tmp_path):
    import dataclasses

    from convattn.errors import UsageError
    from convattn.training.finetune.settings import FineTuneSettings
    from convattn.training.finetune.trainer import check_finished_settings

    settings = FineTuneSettings(learning_rate=1e-4, batch_size=8, epochs=1.0, warmup_ratio=0.1, weight_decay=0.01,
                                layer_decay=1.0, adam_epsilon=1e-6, max_length=32, precision="fp32")
    (tmp_path / "run.json").write_text(json.dumps(
        {"settings": dataclasses.asdict(dataclasses.replace(settings, precision="bf16"))}))
    with pytest.raises(UsageError) as caught:
        check_finished_settings(tmp_path, settings)
    message = caught.value.describe(lambda field: "--" + field.replace("_", "-"))
    assert message == (f"{tmp_path} was made with other settings (--precision bf16 there, fp32 now); give "
                       "--precision bf16 to add to its seeds, or another --output-dir (--overwrite replaces that run)")
    check_finished_settings(tmp_path, dataclasses.replace(settings, precision="bf16", compile="default"))


@pytest.mark.parametrize(("hidden", "base"), [(768, True), (704, False)])
def test_a_model_768_wide_or_more_takes_the_recipes_base_size_settings(hidden, base, tmp_path):
    """BERT-base's width and up is base size: Chang et al.'s GLUE recipe fine-tunes it at 1e-4, a narrower model at
    3e-4."""
    from convattn import ConvAttnConfig, ConvAttnForMaskedLM
    from convattn.training.finetune.pretrained import load_pretrained
    from convattn.training.glue import load_glue_recipe, resolve_settings

    tokenizer = tiny_wordpiece_tokenizer(SENTENCES)
    config = ConvAttnConfig.from_preset("chang2021-small/absolute", hidden_size=hidden, num_hidden_layers=1,
                                        num_attention_heads=2, intermediate_size=64, embedding_size=32,
                                        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    ConvAttnForMaskedLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    pretrained = load_pretrained(str(tmp_path), "glue", "fine-tuned")
    assert pretrained.base_size is base
    settings = resolve_settings(load_glue_recipe("chang2021"), "sst2", pretrained.base_size, {}, {}, from_mnli=False)
    assert settings.learning_rate == (1e-4 if base else 3e-4)


def test_the_longest_input_is_what_the_models_positions_allow():
    """RoBERTa-style models number positions from pad_token_id + 1: of 514 embeddings, 512 are usable."""
    from transformers import RobertaConfig

    from convattn import ConvAttnConfig
    from convattn.training.finetune.pretrained import input_limit

    assert input_limit(RobertaConfig(max_position_embeddings=514, pad_token_id=1)) == 512
    assert input_limit(BertConfig(max_position_embeddings=512, pad_token_id=0)) == 512
    assert input_limit(ConvAttnConfig.from_preset("chang2021-small/composite")) is None  # relative positions only
    assert input_limit(ConvAttnConfig.from_preset("chang2021-small/absolute", max_position_embeddings=128)) == 128


@pytest.mark.parametrize(("types", "given"), [(1, False), (2, True)])
def test_token_types_are_given_to_a_model_with_more_than_one(types, given, tmp_path):
    """A model of one token type (RoBERTa's kind) gets no token type ids: a pair's second text would index past
    its one embedding."""
    from convattn import ConvAttnConfig, ConvAttnForMaskedLM
    from convattn.training.finetune.pretrained import load_pretrained

    tokenizer = tiny_wordpiece_tokenizer(SENTENCES)
    config = ConvAttnConfig.from_preset("chang2021-small/absolute", hidden_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, intermediate_size=64, embedding_size=32,
                                        type_vocab_size=types, vocab_size=len(tokenizer),
                                        pad_token_id=tokenizer.pad_token_id)
    ConvAttnForMaskedLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert load_pretrained(str(tmp_path), "glue", "fine-tuned").token_types is given
