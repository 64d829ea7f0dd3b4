"""Local text is cached by its content: a file edited in place, to the same size and modification time, is read
again (a key of path, size and time served the old text to a new run and to a resumed one), and the same text
anywhere shares one entry. An empty $CONVATTN_CACHE means the default cache, not the working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from convattn.data.corpus import local_corpus


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def rewrite_keeping_size_and_times(path: Path, text: str) -> None:
    before = os.stat(path)
    assert len(text.encode()) == before.st_size
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns


EDITS = [  # (file edited, its new text: same size)
    ("train.txt", "alpha beta gamma\nalpha beta delta\n" * 20),
    ("valid.txt", "eval lines here\nsome more text!\n"),
]


@pytest.mark.parametrize(("edited", "text"), EDITS, ids=["train", "eval"])
def test_a_file_edited_to_the_same_size_and_time_is_read_again(tmp_path, edited, text):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("alpha beta gamma\nalpha beta gamma\n" * 20)
    (corpus / "valid.txt").write_text("eval lines here\nsome more text.\n")
    files = [str(corpus / "train.txt")], [str(corpus / "valid.txt")]
    first = local_corpus(*files, tmp_path / "cache")
    rewrite_keeping_size_and_times(corpus / edited, text)
    again = local_corpus(*files, tmp_path / "cache")
    assert again.identity != first.identity
    read = again.train if edited == "train.txt" else again.eval
    assert "\n".join(read["text"]) + "\n" == text


def test_the_same_text_elsewhere_has_the_same_identity(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "text.txt").write_text("one line of text\nanother line\n" * 10)
    here, there = (local_corpus([str(tmp_path / f / "text.txt")], [], tmp_path / "cache") for f in ("a", "b"))
    assert here.identity == there.identity


@pytest.mark.parametrize(("value", "expected"), [
    (None, ".cache/convattn"), ("", ".cache/convattn"), ("~/elsewhere", "elsewhere"), ("/abs/cache", "/abs/cache"),
])
def test_convattn_cache_unset_or_empty_is_the_default(monkeypatch, tmp_path, value, expected):
    from convattn.training.pretrain import default_cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    if value is None:
        monkeypatch.delenv("CONVATTN_CACHE", raising=False)
    else:
        monkeypatch.setenv("CONVATTN_CACHE", value)
    assert default_cache_dir() == tmp_path / expected
