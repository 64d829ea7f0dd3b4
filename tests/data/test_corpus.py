"""Corpus sources: local files (validated up front), the hub (offline message), the embedded default."""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import pytest

from convattn.data import corpus
from convattn.data.corpus import bounded_pieces, embedded_corpus, load_corpus, resolve_text_files
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
    (tmp_path / "d" / ".git" / "objects").mkdir(parents=True)  # a hidden directory's files: skipped, binary or not
    (tmp_path / "d" / ".git" / "objects" / "pack").write_bytes(b"PACK\0\0\0\2")
    write(tmp_path / "d" / ".cache" / "notes.txt", "skipped too\n")
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


def test_a_glob_takes_the_files_it_matches_not_directories(tmp_path):
    top = write(tmp_path / "g" / "top.txt", "a line\n")
    write(tmp_path / "g" / "inner" / "deep.txt", "another line\n")
    assert resolve_text_files([str(tmp_path / "g" / "*")]) == [top]
    assert resolve_text_files([str(tmp_path / "g" / "**" / "*.txt")]) == [tmp_path / "g" / "inner" / "deep.txt", top]
    with pytest.raises(UsageError, match=r"in\*: the pattern matches no files$"):
        resolve_text_files([str(tmp_path / "g" / "in*")])


def test_local_corpus_holds_out_the_tail_without_eval_file(tmp_path):
    write(tmp_path / "t.txt", "".join(f"line {i}\n\n" for i in range(300)))
    corpus = load_corpus(None, None, [str(tmp_path / "t.txt")], [], tmp_path / "cache")
    assert len(corpus.train) == 297 and corpus.eval["text"] == ["line 297", "line 298", "line 299"]
    with_eval = load_corpus(None, None, [str(tmp_path / "t.txt")], [str(tmp_path / "t.txt")], tmp_path / "cache",
                            allow_eval_overlap=True)
    assert len(with_eval.train) == len(with_eval.eval) == 300 and with_eval.identity != corpus.identity
    assert with_eval.eval_overlap.startswith("eval text is training text")
    # the same file is said as such, not as lines that happen to repeat
    assert "the same file" in with_eval.eval_overlap
    assert with_eval.notes == [f"eval: {with_eval.eval_overlap}, as --allow-eval-overlap allows"]


def test_the_corpus_identity_follows_how_long_rows_are_cut(tmp_path, monkeypatch):
    """The cache key changes with MAX_ROW_CHARS: rows cut elsewhere are other rows, never a stale cache's."""
    write(tmp_path / "t.txt", "".join(f"line {i}\n" for i in range(300)))
    before = load_corpus(None, None, [str(tmp_path / "t.txt")], [], tmp_path / "cache").identity
    monkeypatch.setattr(corpus, "MAX_ROW_CHARS", 5)
    assert load_corpus(None, None, [str(tmp_path / "t.txt")], [], tmp_path / "cache").identity != before


def test_unreachable_hub_dataset_is_one_line_pointing_at_local_files(tmp_path):
    with pytest.raises(UsageError) as err:
        load_corpus("Salesforce/wikitext", "wikitext-103-raw-v1", [], [], tmp_path)
    message = str(err.value)
    assert "`train_file`" in message and "Salesforce/wikitext" in message and "\n" not in message


def hub(monkeypatch, **splits: list[str]) -> list:
    """`load_hub_dataset` answering with these splits of a "text" column (what --dataset NAME loads); the calls
    it got, in the list returned."""
    calls = []

    def load(name, config, cache_dir):
        calls.append((name, config))
        return datasets.DatasetDict({split: datasets.Dataset.from_dict({"text": rows, "id": list(range(len(rows)))})
                                     for split, rows in splits.items()})
    monkeypatch.setattr(corpus, "load_hub_dataset", load)
    return calls


def test_a_hub_datasets_rows_are_bounded_and_blank_ones_dropped_its_validation_split_the_eval(tmp_path, monkeypatch):
    """A hub dataset's "text" rows (wikitext's blank lines included) as rows of at most MAX_ROW_CHARS characters,
    cut at whitespace, blank ones dropped; the eval its "validation" split, before "valid" and "test"."""
    monkeypatch.setattr(corpus, "MAX_ROW_CHARS", 12)
    calls = hub(monkeypatch, train=["", " = Title = ", "alpha beta gamma delta", "   ", "last"],
                test=["test row"], validation=["", "valid row", " "], valid=["other row"])
    data = load_corpus("some/wikitext", "raw", [], [], tmp_path / "cache")
    assert calls == [("some/wikitext", "raw")]
    assert data.train["text"] == [" = Title = ", "alpha beta", "gamma delta", "last"]
    assert data.eval["text"] == ["valid row"] and data.train.column_names == ["text"]
    assert data.description == "some/wikitext (raw) from the hub" and data.eval_overlap is None
    assert data.identity.startswith("hub[some/wikitext:raw:") and data.identity.endswith(":validation]")
    hub(monkeypatch, train=["", " = Title = ", "alpha beta gamma delta", "   ", "last", "one more"],
        validation=["valid row"])
    assert load_corpus("some/wikitext", "raw", [], [], tmp_path / "cache").identity != data.identity


def test_a_hub_dataset_without_an_eval_split_holds_out_its_last_rows_or_takes_eval_files(tmp_path, monkeypatch):
    hub(monkeypatch, train=[f"row {i}" for i in range(300)], test=["test row"])
    assert load_corpus("d", None, [], [], tmp_path / "cache").eval["text"] == ["test row"]
    hub(monkeypatch, train=[f"row {i}" for i in range(300)])
    held = load_corpus("d", None, [], [], tmp_path / "cache")
    assert held.train["text"] == [f"row {i}" for i in range(297)]
    assert held.eval["text"] == ["row 297", "row 298", "row 299"] and held.identity.endswith(":None]")
    given = load_corpus("d", None, [], [str(write(tmp_path / "eval.txt", "an eval line\n"))], tmp_path / "cache")
    assert len(given.train) == 300 and given.eval["text"] == ["an eval line"] and given.identity != held.identity
    with pytest.raises(UsageError, match="eval text is training text"):
        load_corpus("d", None, [], [str(write(tmp_path / "same.txt", "row 5\n"))], tmp_path / "cache")


def test_a_corpus_of_one_line_without_eval_text_is_refused_in_one_line(tmp_path, monkeypatch):
    """Holding out from one line would leave nothing to train on: refused, naming --eval-file (two lines: one each)."""
    write(tmp_path / "one.txt", "the only line\n\n")
    with pytest.raises(UsageError, match=r"^the corpus has fewer than 2 lines of text; give more text or an "
                                         r"`eval_file`$"):
        load_corpus(None, None, [str(tmp_path / "one.txt")], [], tmp_path / "cache")
    hub(monkeypatch, train=["", "the only row"])
    with pytest.raises(UsageError, match="fewer than 2 lines"):
        load_corpus("d", None, [], [], tmp_path / "cache")
    write(tmp_path / "two.txt", "first line\nsecond line\n")
    two = load_corpus(None, None, [str(tmp_path / "two.txt")], [], tmp_path / "cache")
    assert two.train["text"] == ["first line"] and two.eval["text"] == ["second line"]


def test_a_hub_dataset_without_a_train_split_or_text_column_is_one_line(tmp_path, monkeypatch):
    hub(monkeypatch, validation=["a row"])
    with pytest.raises(UsageError, match=r"^dataset 'd' has no 'train' split \(it has validation\)$"):
        load_corpus("d", None, [], [], tmp_path / "cache")
    monkeypatch.setattr(corpus, "load_hub_dataset", lambda name, config, cache_dir: datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"sentence": ["a row"]})}))
    with pytest.raises(UsageError, match=r"^dataset 'd' has no 'text' column \(it has sentence\)$"):
        load_corpus("d", None, [], [], tmp_path / "cache")


def test_dataset_and_train_file_are_exclusive(tmp_path):
    with pytest.raises(UsageError, match="either `dataset` or `train_file`"):
        load_corpus("x", None, ["y"], [], tmp_path)


def test_the_embedded_corpus_keeps_prose_paragraphs_of_eight_words_or_more():
    """What a docstring gives the embedded default: its paragraphs of prose, each on one line; not short ones
    (signatures, headings), code, lists, rules, or text mostly of digits and symbols."""
    docstring = "\n\n".join([
        "one two three four five six seven",
        "one two three four five six seven eight",
        "a paragraph that goes on\n    over two indented lines of text",
        ">>> print('an example of code that has eight words')",
        ".. note:: a directive of reStructuredText with eight words",
        "- an item of a list that has eight words",
        "== a rule of equals signs with eight words here",
        "x = f(1, 2) + g(3, 4) * h(5, 6) / k(7, 8)",
    ])
    assert list(corpus._paragraphs(docstring)) == ["one two three four five six seven eight",
                                                   "a paragraph that goes on over two indented lines of text"]


def test_the_embedded_corpus_writes_a_paragraph_once_whatever_its_case(tmp_path, monkeypatch):
    """A paragraph many modules repeat (a license line, "Return a new array...") trains once, its first time;
    sources go wholly to train or to eval."""
    sources = [(f"pkg:module{i}.py", [f"Shared paragraph of the docs, eight words long {i % 2}".upper()
                                      if i % 3 else f"shared paragraph of the docs, eight words long {i % 2}",
                                      f"a paragraph of module number {i} alone, eight words"]) for i in range(40)]
    monkeypatch.setattr(corpus, "_documentation_sources", lambda: ((name, iter(rows)) for name, rows in sources))
    train, evaluation = corpus.build_embedded_text(tmp_path)
    lines = train.read_text().splitlines() + evaluation.read_text().splitlines()
    assert sorted(line.lower() for line in lines if "shared" in line.lower()) == [
        f"shared paragraph of the docs, eight words long {k}" for k in (0, 1)]
    assert len([line for line in lines if "alone" in line]) == 40 and evaluation.read_text() and train.read_text()
    for name, rows in sources:
        alone = rows[1] + "\n"
        assert (alone in train.read_text()) != (alone in evaluation.read_text()), name


@pytest.mark.slow
def test_embedded_default_is_big_deduplicated_and_cached(tmp_path):
    corpus = embedded_corpus(tmp_path)
    train, evaluation = corpus.train["text"], corpus.eval["text"]
    assert sum(map(len, train)) > 2_000_000 and len(evaluation) > 500
    assert len(set(train)) == len(train) and not set(train) & set(evaluation)
    again = embedded_corpus(tmp_path)  # read back from the cache, same text
    assert again.identity == corpus.identity and again.train["text"][:100] == train[:100]


def test_a_binary_file_is_refused_by_name(tmp_path):
    path = tmp_path / "zeros.txt"
    path.write_bytes(b"some text\n" + b"\0" * 3000)
    with pytest.raises(UsageError, match=r"zeros.txt: a binary file, not text \(a NUL byte at offset 10\)"):
        resolve_text_files([str(path)])
    first = tmp_path / "first.txt"  # one NUL, the file's first byte, before text that decodes
    first.write_bytes(b"\0" + b"plain text that decodes as UTF-8\n" * 3)
    with pytest.raises(UsageError, match=r"first.txt: a binary file, not text \(a NUL byte at offset 0\)"):
        resolve_text_files([str(first)])


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_a_short_utf16_file_without_a_byte_order_mark_is_named_utf16_not_binary(tmp_path, encoding):
    path = tmp_path / "short.txt"  # 26 bytes: a NUL beside every character, and no BOM to say so
    path.write_bytes("a short line.\n".encode(encoding))
    with pytest.raises(UsageError, match=r"short.txt: UTF-16 text, not UTF-8; convert it"):
        resolve_text_files([str(path)])


def test_a_file_ending_inside_a_character_is_refused_by_name(tmp_path):
    path = tmp_path / "cut.txt"
    path.write_bytes("text, then a cut euro sign: \u20ac".encode()[:-1])
    with pytest.raises(UsageError, match=r"cut.txt: ends in the middle of a UTF-8 character"):
        resolve_text_files([str(path)])


def test_an_unreadable_file_is_one_line_naming_it(tmp_path, monkeypatch):
    path = write(tmp_path / "secret.txt", "text\n")

    def refuse(file, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr(corpus, "open", refuse, raising=False)  # the tests may run as root, which reads anything
    with pytest.raises(UsageError, match=r"secret.txt: cannot read it \(Permission denied\)"):
        resolve_text_files([str(path)])


def test_an_unreadable_directory_is_named(tmp_path, monkeypatch):
    write(tmp_path / "d" / "sub" / "a.txt", "text\n")
    real_walk = os.walk

    def walk(top, onerror=None, **kwargs):
        onerror(PermissionError(13, "Permission denied", str(Path(top) / "sub")))
        return real_walk(top, **kwargs)

    monkeypatch.setattr(corpus.os, "walk", walk)
    with pytest.raises(UsageError, match=r"sub: cannot read the directory \(Permission denied\)"):
        resolve_text_files([str(tmp_path / "d")])


def test_cache_dir_that_is_a_file_is_one_line(tmp_path):
    write(tmp_path / "t.txt", "line\n" * 10)
    write(tmp_path / "cache", "not a directory")
    with pytest.raises(UsageError, match=r"^`cache_dir` .*cache is a file; point `cache_dir`"):
        load_corpus(None, None, [str(tmp_path / "t.txt")], [], tmp_path / "cache")


@pytest.mark.parametrize("limit", [1, 5, 12, 1000])
def test_long_text_is_cut_at_whitespace_into_bounded_pieces(limit):
    text = "alpha beta  gamma\tdelta " + "x" * 30 + " epsilon"
    pieces = list(bounded_pieces(text, limit))
    assert all(len(piece) <= limit for piece in pieces)
    assert " ".join(pieces).split() == text.split() or limit < 30  # a word longer than the limit is cut
    assert "".join("".join(pieces).split()) == "".join(text.split())


@pytest.mark.parametrize(("text", "limit", "pieces"), [
    ("aaa bbb", 7, ["aaa bbb"]),  # exactly the limit: one piece
    ("aaaaaa bbbbbcc", 6, ["aaaaaa", " bbbbb", "cc"]),  # a window whose one whitespace leads it is a piece whole
    ("alpha beta gamma", 11, ["alpha beta", "gamma"]),  # cut at the window's last whitespace, which is dropped
    ("alpha beta gamma", 8, ["alpha", "beta", "gamma"]),
])
def test_the_pieces_of_a_text_are_exactly_these(text, limit, pieces):
    """Where a row is cut decides its tokens, and so every number a run on the corpus reports: pinned."""
    assert list(bounded_pieces(text, limit)) == pieces


def test_an_over_long_line_is_read_in_bounded_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "MAX_ROW_CHARS", 1000)
    words = [f"word{i}" for i in range(60_000)]  # one line of about 500,000 characters
    write(tmp_path / "t.txt", "short first line\n" + " ".join(words) + "\n" + "z" * 2500 + "\nlast line")
    data = load_corpus(None, None, [str(tmp_path / "t.txt")], [str(tmp_path / "t.txt")], tmp_path / "cache",
                       allow_eval_overlap=True)
    rows = data.train["text"]
    assert rows[0] == "short first line" and rows[-1] == "last line" and rows[-4:-1] == ["z" * 1000] * 2 + ["z" * 500]
    assert max(map(len, rows)) <= 1000 and " ".join(rows[1:-4]).split() == words


def test_rows_match_the_datasets_text_loader(tmp_path):
    text = "first\r\nsecond\rthird\n\n  \nfourth\u2028fifth\x0csixth\u0085seventh\n last \n\nno newline at end"
    write(tmp_path / "a.txt", text)
    write(tmp_path / "b.txt", "another file\n")
    files = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    ours = load_corpus(None, None, files, files, tmp_path / "cache", allow_eval_overlap=True).train["text"]
    theirs = datasets.load_dataset("text", data_files=files, split="train", cache_dir=str(tmp_path / "hf"))["text"]
    assert ours == [row for row in theirs if row.strip()]


WIKITEXT_VALID = Path("/work/shared/data/wikitext-103-raw/wiki.valid.raw")


@pytest.mark.skipif(not WIKITEXT_VALID.is_file(), reason=f"real data not present: {WIKITEXT_VALID}")
def test_wikitext_rows_match_the_datasets_text_loader(tmp_path):
    ours = load_corpus(None, None, [str(WIKITEXT_VALID)], [str(WIKITEXT_VALID)], tmp_path / "cache",
                       allow_eval_overlap=True).train["text"]
    theirs = datasets.load_dataset("text", data_files=[str(WIKITEXT_VALID)], split="train",
                                   cache_dir=str(tmp_path / "hf"))["text"]
    assert list(ours) == [row for row in theirs if row.strip()] and len(ours) > 2000


# ---------------------------------------------------------------------------------- what a run trains and scores on
def overlap_cases(tmp_path):
    """(train patterns, eval patterns) whose eval text is training text."""
    text = "".join(f"line {i} of the training text\n" for i in range(40))
    train = write(tmp_path / "corpus" / "train.txt", text)
    write(tmp_path / "corpus" / "more.txt", "other lines\nof text\n")
    copy = write(tmp_path / "copy.txt", text)
    (tmp_path / "link.txt").symlink_to(train)
    mostly = write(tmp_path / "mostly.txt", text + "one new line\n")
    return {
        "the same file": ([str(train)], [str(train)]),
        "a link to it": ([str(train)], [str(tmp_path / "link.txt")]),
        "a copy": ([str(train)], [str(copy)]),
        "inside a train folder": ([str(tmp_path / "corpus")], [str(train)]),
        "a folder holding it": ([str(train)], [str(tmp_path / "corpus")]),
        "a glob": ([str(train)], [str(tmp_path / "corpus" / "*.txt")]),
        "mostly its lines": ([str(train)], [str(mostly)]),
    }


@pytest.mark.parametrize("case", ["the same file", "a link to it", "a copy", "inside a train folder",
                                  "a folder holding it", "a glob", "mostly its lines"])
def test_eval_text_that_is_training_text_is_refused_naming_both(tmp_path, case):
    train, evaluation = overlap_cases(tmp_path)[case]
    with pytest.raises(UsageError) as err:
        load_corpus(None, None, train, evaluation, tmp_path / "cache")
    message = str(err.value)
    assert "eval text is training text" in message and "`allow_eval_overlap`" in message and "\n" not in message
    assert "`eval_file`" in message and str(tmp_path) in message
    allowed = load_corpus(None, None, train, evaluation, tmp_path / "cache", allow_eval_overlap=True)
    assert allowed.eval_overlap.startswith("eval text is training text")
    assert any("--allow-eval-overlap" in note for note in allowed.notes)


def test_eval_overlap_is_refused_before_anything_is_read(tmp_path):
    from convattn.data.corpus import check_text_flags

    train, evaluation = overlap_cases(tmp_path)["a link to it"]
    with pytest.raises(UsageError, match="the same file as `train_file`"):
        check_text_flags(train, evaluation)
    check_text_flags(train, evaluation, allow_eval_overlap=True)


def test_a_few_shared_eval_lines_are_counted_not_refused(tmp_path):
    train = write(tmp_path / "train.txt", "= References =\n" + "".join(f"train line {i}\n" for i in range(20)))
    valid = write(tmp_path / "valid.txt", "= References =\n" + "".join(f"eval line {i}\n" for i in range(9)))
    corpus = load_corpus(None, None, [str(train)], [str(valid)], tmp_path / "cache")
    assert corpus.eval_overlap is None
    assert corpus.notes == ["eval: 1 of the 10 eval lines (10%) are also in the training text (repeated lines such "
                            "as headings); the eval perplexity includes them"]


def test_eval_text_half_training_lines_is_counted_and_more_than_half_refused(tmp_path):
    train = write(tmp_path / "train.txt", "".join(f"train line {i}\n" for i in range(20)))
    half = write(tmp_path / "half.txt", "train line 1\ntrain line 2\neval line 1\neval line 2\n")
    corpus = load_corpus(None, None, [str(train)], [str(half)], tmp_path / "cache")
    assert corpus.eval_overlap is None and corpus.notes[0].startswith("eval: 2 of the 4 eval lines (50%)")
    more = write(tmp_path / "more.txt", "train line 1\ntrain line 2\ntrain line 3\neval line 1\n")
    with pytest.raises(UsageError, match="3 of the 4 eval lines"):
        load_corpus(None, None, [str(train)], [str(more)], tmp_path / "cache")


def test_shared_eval_lines_are_counted_each_time_they_occur(tmp_path):
    """An eval text of one training line repeated is mostly training text, however few distinct lines it shares."""
    train = write(tmp_path / "train.txt", "".join(f"train line {i}\n" for i in range(20)))
    valid = write(tmp_path / "valid.txt", "train line 3\n" * 6 + "".join(f"eval line {i}\n" for i in range(4)))
    with pytest.raises(UsageError, match="6 of the 10 eval lines"):
        load_corpus(None, None, [str(train)], [str(valid)], tmp_path / "cache")


def test_training_files_are_read_once_by_path_and_content(tmp_path):
    a = write(tmp_path / "corpus" / "a.txt", "first file\n")
    write(tmp_path / "corpus" / "b.txt", "second file\n")
    (tmp_path / "corpus" / "c.txt").symlink_to(a)  # a folder holding a link to one of its own files
    copy = write(tmp_path / "copy.txt", "first file\n")
    corpus = load_corpus(None, None, [str(tmp_path / "corpus"), str(a), str(tmp_path / "corpus" / "*.txt"),
                                      str(copy)], [], tmp_path / "cache")
    assert sorted([*corpus.train["text"], *corpus.eval["text"]]) == ["first file", "second file"]
    assert corpus.description.startswith("2 file(s)")
    [note] = corpus.notes
    assert note.startswith("--train-file: 6 duplicate file(s) read once, not twice: ")
    assert f"{tmp_path / 'corpus' / 'c.txt'} (the same file as {a})" in note and "\n" not in note
    assert not load_corpus(None, None, [str(a), str(tmp_path / "corpus" / "b.txt")], [], tmp_path / "cache").notes


def test_the_texts_fingerprint_follows_its_lines_and_which_split_holds_them():
    from convattn.training.pretrain.data import text_fingerprint

    def rows(*lines):
        return datasets.Dataset.from_dict({"text": list(lines)})

    fingerprint = text_fingerprint(rows("a b", "c d"), rows("e f"))
    assert fingerprint == text_fingerprint(rows("a b", "c d"), rows("e f"))  # wherever it was read from
    assert len({fingerprint, text_fingerprint(rows("a b"), rows("c d", "e f")),  # a line moved to the other split
                text_fingerprint(rows("a b", "c d"), rows("e g")), text_fingerprint(rows("c d", "a b"), rows("e f")),
                text_fingerprint(rows("a b c d"), rows("e f"))}) == 5
