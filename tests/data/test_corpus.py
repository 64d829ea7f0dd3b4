"""Corpus sources: local files (validated up front), the hub (offline message), the embedded default."""

from __future__ import annotations

import pytest

from convattn.data.corpus import embedded_corpus, load_corpus, resolve_text_files
from convattn.errors import UsageError


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_files_directories_and_globs_expand_in_sorted_order(tmp_path):
    a = write(tmp_path / "d" / "b.txt", "second file\n")
    b = write(tmp_path / "d" / "a.txt", "first file\n")
    write(tmp_path / "d" / ".hidden", "skipped\n")
    c = write(tmp_path / "e" / "x.raw", "third\n")
    assert resolve_text_files([str(tmp_path / "d")]) == [b, a]
    assert resolve_text_files([str(tmp_path / "*" / "*.raw"), str(b)]) == [c, b]


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p / "missing.txt", "no such file"),
        (lambda p: write(p / "empty.txt", ""), "empty"),
        (lambda p: write(p / "blank.txt", "\n \n"), "empty"),
        (lambda p: (p / "bad.txt").write_bytes(b"good text\n\xff\xfe bad\n") and p / "bad.txt", "offset 10"),
        (lambda p: p / "nothing-*.txt", "matches no files"),
    ],
)
def test_bad_files_name_the_file_and_the_fix(tmp_path, make, needle):
    path = make(tmp_path)
    with pytest.raises(UsageError) as err:
        resolve_text_files([str(path)])
    assert needle in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_local_corpus_holds_out_the_tail_without_eval_file(tmp_path):
    write(tmp_path / "t.txt", "".join(f"line {i}\n\n" for i in range(300)))
    corpus = load_corpus(None, None, [str(tmp_path / "t.txt")], [], tmp_path / "cache")
    assert len(corpus.train) == 297 and corpus.eval["text"] == ["line 297", "line 298", "line 299"]
    with_eval = load_corpus(None, None, [str(tmp_path / "t.txt")], [str(tmp_path / "t.txt")], tmp_path / "cache")
    assert len(with_eval.train) == len(with_eval.eval) == 300 and with_eval.identity != corpus.identity


def test_unreachable_hub_dataset_is_one_line_pointing_at_local_files(tmp_path):
    with pytest.raises(UsageError) as err:
        load_corpus("Salesforce/wikitext", "wikitext-103-raw-v1", [], [], tmp_path)
    message = str(err.value)
    assert "--train-file" in message and "Salesforce/wikitext" in message and "\n" not in message


def test_dataset_and_train_file_are_exclusive(tmp_path):
    with pytest.raises(UsageError, match="either --dataset or --train-file"):
        load_corpus("x", None, ["y"], [], tmp_path)


@pytest.mark.slow
def test_embedded_default_is_big_deduplicated_and_cached(tmp_path):
    corpus = embedded_corpus(tmp_path)
    train, evaluation = corpus.train["text"], corpus.eval["text"]
    assert sum(map(len, train)) > 2_000_000 and len(evaluation) > 500
    assert len(set(train)) == len(train) and not set(train) & set(evaluation)
    again = embedded_corpus(tmp_path)  # read back from the cache, same text
    assert again.identity == corpus.identity and again.train["text"][:100] == train[:100]
