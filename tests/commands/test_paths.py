"""A path given with `~` (quoted, so the shell left it) is the home folder's for every consumer: expanded once where
the flags are read, so one run never splits between ./~/x (convattn) and ~/x (the Trainer, which expands it)."""

from __future__ import annotations

import pytest
from helpers.pretrain import TINY, write_corpus

from convattn.cli import build_parser, main

PRETRAIN_PATHS = [  # (flag, value, what it becomes in the run's options, relative to HOME)
    ("--output-dir", "~/runs/x", lambda options: options.output_dir, "runs/x"),
    ("--cache-dir", "~/cache", lambda options: options.cache_dir, "cache"),
    ("--train-file", "~/text/train.txt", lambda options: options.train_files[0], "text/train.txt"),
    ("--eval-file", "~/text/valid.txt", lambda options: options.eval_files[0], "text/valid.txt"),
    ("--tokenizer", "~/tokenizer", lambda options: options.tokenizer, "tokenizer"),
]


@pytest.mark.parametrize(("flag", "value", "read", "expected"), PRETRAIN_PATHS)
def test_pretrain_paths_expand_the_home_folder(tmp_path, monkeypatch, flag, value, read, expected):
    from convattn.commands.pretrain import options_from_args

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    extra = ["--train-file", "t.txt"] if flag == "--eval-file" else []
    options = options_from_args(build_parser().parse_args(["pretrain", *extra, flag, value]))
    assert str(read(options)) == str(tmp_path / expected)


COMPARE_PATHS = [  # (flag, value, the parsed argument, relative to HOME)
    ("--output-dir", "~/cmp", "output_dir", "cmp"),
    ("--cache-dir", "~/cache", "cache_dir", "cache"),
    ("--glue-data-dir", "~/glue_data", "glue_data_dir", "glue_data"),
    ("--squad-train-file", "~/train.json", "squad_train_file", "train.json"),
]


@pytest.mark.parametrize(("flag", "value", "name", "expected"), COMPARE_PATHS)
def test_compare_paths_expand_the_home_folder(tmp_path, monkeypatch, flag, value, name, expected):
    monkeypatch.setenv("HOME", str(tmp_path))
    args = build_parser().parse_args(["compare", "--presets", "chang2021-small/absolute", flag, value])
    assert getattr(args, name) == tmp_path / expected


def test_options_built_in_python_expand_the_home_folder(tmp_path, monkeypatch):
    from pathlib import Path

    from convattn.training.pretrain import PretrainOptions
    from convattn.training.recipes import load_recipe

    monkeypatch.setenv("HOME", str(tmp_path))
    options = PretrainOptions(recipe=load_recipe("default"), output_dir=Path("~/run"), cache_dir=Path("~/c"))
    assert (options.output_dir, options.cache_dir) == (tmp_path / "run", tmp_path / "c")


def test_a_run_given_a_quoted_home_folder_lands_whole_in_it(tmp_path, tmp_path_factory, monkeypatch):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    write_corpus(home)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CONVATTN_CACHE", str(tmp_path_factory.getbasetemp() / "convattn-cache"))
    monkeypatch.chdir(work)
    argv = ["pretrain", *TINY, "--max-steps", "2", "--warmup", "1", "--eval-every", "2", "--train-file",
            "~/train.txt", "--eval-file", "~/valid.txt", "--output-dir", "~/run"]
    assert main(argv) == 0
    assert (home / "run" / "model.safetensors").is_file() and (home / "run" / "checkpoints" / "checkpoint-2").is_dir()
    assert list(work.iterdir()) == []  # no ./~ beside it


OTHER_PATHS = [  # (command line, the parsed argument, relative to HOME)
    (["glue", "--model", "~/m", "--task", "sst2"], "model", "m"),
    (["glue", "--model", "m", "--task", "sst2", "--data-dir", "~/glue_data"], "data_dir", "glue_data"),
    (["glue", "--model", "m", "--task", "sst2", "--output-dir", "~/g"], "output_dir", "g"),
    (["squad", "--model", "~/m", "--version", "1.1"], "model", "m"),
    (["squad", "--model", "m", "--version", "1.1", "--train-file", "~/t.json"], "train_file", "t.json"),
    (["squad", "--model", "m", "--version", "1.1", "--dev-file", "~/d.json"], "dev_file", "d.json"),
    (["squad", "--model", "m", "--version", "1.1", "--output-dir", "~/s"], "output_dir", "s"),
    (["plot", "kernels", "~/m"], "checkpoint", "m"),
    (["plot", "kernels", "m", "--output-dir", "~/figures"], "output_dir", "figures"),
    (["plot", "attention", "~/m"], "checkpoint", "m"),
    (["plot", "attention", "m", "--output-dir", "~/figures"], "output_dir", "figures"),
    (["export", "~/m", "--onnx", "x.onnx"], "model_dir", "m"),
    (["export", "m", "--onnx", "~/x.onnx"], "onnx", "x.onnx"),
    (["push", "~/m", "--repo", "me/m"], "run_dir", "m"),
]


@pytest.mark.parametrize(("argv", "name", "expected"), OTHER_PATHS)
def test_every_commands_paths_expand_the_home_folder(tmp_path, monkeypatch, argv, name, expected):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert str(getattr(build_parser().parse_args(argv), name)) == str(tmp_path / expected)


def test_a_hub_model_id_is_left_as_it_is():
    assert build_parser().parse_args(["glue", "--model", "YituTech/conv-bert-small", "--task", "sst2"]).model == \
        "YituTech/conv-bert-small"
