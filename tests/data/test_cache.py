"""Cache entries: complete or absent, one builder at a time, checked on load, leftovers of killed runs removed."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from convattn.data.cache import MANIFEST, cache_entry, check_cache_dir, entry_problem
from convattn.errors import UsageError


def write_files(contents: dict[str, str]):
    def build(tmp: Path) -> None:
        for name, text in contents.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)

    return build


def visible(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def test_an_entry_is_built_once_with_a_manifest_and_reused(tmp_path):
    built = []
    entry = tmp_path / "kind" / "entry"
    build = write_files({"a.txt": "alpha", "sub/b.txt": "beta"})
    assert cache_entry(entry, lambda tmp: built.append(build(tmp)), "test data") == entry
    assert cache_entry(entry, lambda tmp: built.append(build(tmp)), "test data") == entry
    assert len(built) == 1 and (entry / "sub" / "b.txt").read_text() == "beta"
    assert set(json.loads((entry / MANIFEST).read_text())["files"]) == {"a.txt", "sub/b.txt"}
    assert visible(tmp_path / "kind") == ["entry"] and entry_problem(entry) is None


def test_a_failed_build_leaves_nothing(tmp_path):
    def build(tmp: Path) -> None:
        (tmp / "half.txt").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache_entry(tmp_path / "entry", build, "test data")
    assert visible(tmp_path) == []


@pytest.mark.parametrize(
    "damage",
    [
        lambda entry: (entry / "a.txt").write_text("alphA"),  # same size, other bytes
        lambda entry: (entry / "a.txt").unlink(),
        lambda entry: (entry / "extra.txt").write_text("?"),
        lambda entry: (entry / MANIFEST).unlink(),  # a writer killed before the manifest (or an old cache)
        lambda entry: (entry / MANIFEST).write_text("{not json"),
    ],
)
def test_a_damaged_entry_is_detected_and_rebuilt(tmp_path, damage, cache_log):
    entry = tmp_path / "entry"
    cache_entry(entry, write_files({"a.txt": "alpha"}), "test data")
    damage(entry)
    assert entry_problem(entry) is not None
    cache_entry(entry, write_files({"a.txt": "alpha"}), "test data")
    assert entry_problem(entry) is None and visible(entry) == ["a.txt"]
    assert "rebuilding the cached test data" in cache_log.text


def test_leftovers_of_killed_writers_are_removed(tmp_path):
    for leftover in ("entry.tmp", "entry.tmp-123-deadbeef"):
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "partial.bin").write_bytes(b"\0" * 10)
    cache_entry(tmp_path / "entry", write_files({"a.txt": "alpha"}), "test data")
    assert visible(tmp_path) == ["entry"]


def test_cache_dir_that_is_a_file_or_cannot_be_created(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match=r"`cache_dir` .*file is a file"):
        check_cache_dir(tmp_path / "file")
    with pytest.raises(UsageError, match=r"`cache_dir` .*cannot create it"):
        check_cache_dir(tmp_path / "file" / "below")
    assert check_cache_dir(tmp_path / "new" / "cache").is_dir()


def test_a_full_disk_while_writing_is_one_line(tmp_path):
    def build(tmp: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(UsageError, match="No space left on device") as err:
        cache_entry(tmp_path / "entry", build, "test data")
    assert "`cache_dir`" in str(err.value) and "\n" not in str(err.value)
    assert visible(tmp_path) == []


# a whole cold-cache preparation (corpus, tokenizer, formatted data) in a process of its own; it waits for
# the file `go` so that two of them start together, and says whether it trained the tokenizer itself
PREPARE = textwrap.dedent("""
    import hashlib, json, sys, time
    from pathlib import Path
    import convattn.data.tokenizer as tokenizers
    from convattn.data.corpus import load_corpus
    from convattn.data.formatting import cached_format
    work = Path(sys.argv[1])
    train = tokenizers.train_tokenizer
    def announced(*args):
        print("trained", flush=True)
        return train(*args)
    tokenizers.train_tokenizer = announced
    while not (work / "go").exists():
        time.sleep(0.01)
    corpus = load_corpus(None, None, [str(work / "corpus.txt")], [], work / "cache")
    tokenizer = tokenizers.trained_tokenizer(corpus.train, corpus.identity, 300, 64, work / "cache")
    data = cached_format(corpus.train, tokenizer, "pairs", 64, work / "cache" / "formatted" / "train")
    digest = hashlib.sha256(json.dumps(list(data["input_ids"])).encode()).hexdigest()
    print(json.dumps({"tokenizer": tokenizers.tokenizer_fingerprint(tokenizer), "data": digest, "rows": len(data)}))
""")


@pytest.mark.slow
@pytest.mark.timing
def test_two_cold_cache_preparations_at_once_both_succeed_alike(tmp_path):
    words = "cache lock entry rename manifest checksum writer reader process wait reuse winner".split()  # noqa: SIM905
    lines = [" ".join(words[(i * 5 + j) % len(words)] + str(j % 7) for j in range(14)) for i in range(4000)]
    (tmp_path / "corpus.txt").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    runs = [subprocess.Popen([sys.executable, "-c", PREPARE, str(tmp_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    time.sleep(0.5)
    (tmp_path / "go").touch()
    outputs = [run.communicate(timeout=300) for run in runs]
    for run, (_, stderr) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, stderr
    results = [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]
    assert results[0] == results[1] and results[0]["rows"] == 1980
    assert sum(stdout.count("trained") for stdout, _ in outputs) == 1  # the other run reused its tokenizer
    leftovers = [p for p in (tmp_path / "cache").rglob("*") if ".tmp" in p.name]
    assert leftovers == []
