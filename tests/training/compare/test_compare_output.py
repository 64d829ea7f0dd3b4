"""What a comparison leaves besides its report: each recipe note said once, a tokenizer folder as any other."""

import os

import pytest
from helpers.pretrain import main_offline, write_corpus

TINY = ["--layers", "1", "--hidden", "32", "--heads", "4", "--intermediate", "64", "--embedding-size", "16",
        "--vocab-size", "150", "--seq-len", "32", "--batch-size", "8", "--max-steps", "2", "--eval-samples", "16"]


@pytest.mark.slow
def test_notes_are_said_once_and_the_tokenizer_folder_has_the_umask_mode(tmp_path_factory, capsys):
    corpus = write_corpus(tmp_path_factory.mktemp("corpus"), train_lines=200, eval_lines=20)
    out = tmp_path_factory.mktemp("compare") / "out"
    args = ["compare", "--presets", "chang2021-small/absolute", "--seeds", "2", *TINY,
            "--train-file", str(corpus / "train.txt"), "--eval-file", str(corpus / "valid.txt"),
            "--output-dir", str(out)]
    assert main_offline(args, tmp_path_factory) == 0
    err = capsys.readouterr().err.splitlines()
    notes = [line for line in err if "warmup" in line and "(give --warmup to choose)" in line]
    assert len(notes) == 1, err
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "tokenizer").stat().st_mode & 0o777 == 0o777 & ~umask


def test_a_staging_folder_has_the_mode_mkdir_gives(tmp_path):
    from convattn.files import staging_dir

    previous = os.umask(0o022)
    try:
        staging = staging_dir(tmp_path / "models" / "sst2")
    finally:
        os.umask(previous)
    assert staging.parent == tmp_path / "models" and staging.name.startswith(".sst2.")
    assert staging.stat().st_mode & 0o777 == 0o755
