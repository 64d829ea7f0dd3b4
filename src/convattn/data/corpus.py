"""Pretraining corpora: a HuggingFace hub dataset, local text files, or the embedded default.

Every source becomes a `Corpus`: a train and an eval `datasets.Dataset` with one `text` column
(one line or paragraph per row) and an `identity` string that changes whenever the text can change,
so later stages can cache their work under it. Local files are identified by their content (a hash of their
bytes), never by path, size or modification time: a file edited in place, even to the same size and time, is
read again. Local files are checked up front (missing, unreadable,
empty, binary, not UTF-8) so bad input fails before anything is computed or written, then read as streams.
Rows are bounded: a line (or hub row) longer than `MAX_ROW_CHARS` is split at whitespace into pieces of at
most that many characters, so the tokenizer's trainer and the formatting never hold one huge row.

The embedded default needs no network and ships no third-party text: it is extracted at run time
from the documentation that the installed Python and packages carry (the `pydoc` topics and the
docstrings of the standard library, numpy and scikit-learn), deduplicated, and cached as text files.
"""

from __future__ import annotations

import ast
import codecs
import glob
import hashlib
import importlib.util
import os
import re
import sys
import sysconfig
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import datasets

from convattn.data.cache import cache_entry, check_cache_dir
from convattn.data.hub_access import load_hub_dataset
from convattn.errors import UsageError, listed, option
from convattn.runs.folder import LOCK_FILE
from convattn.runs.pretrain import FINAL_MODEL, OPTIONS_FILE

EMBEDDED_VERSION = 1
# packages whose docstrings join the standard library's in the embedded corpus (all dependencies)
EMBEDDED_PACKAGES = ("numpy", "sklearn")
EMBEDDED_EVAL_EVERY = 20  # about 1 source file in 20 is held out for evaluation
HOLDOUT_FRACTION = 0.01  # of a local or hub corpus without its own eval split
HOLDOUT_MAX_ROWS = 5000
# what marks a folder inside a corpus directory as a run's or a model's, not text
RUN_RECORDS = (OPTIONS_FILE, LOCK_FILE, FINAL_MODEL)
MAX_ROW_CHARS = 100_000  # longer lines are split at whitespace into pieces of at most this many characters


EVAL_IS_TRAIN = "eval text is training text"  # what a run's record and report say when it is allowed
# eval text refused as training text: more than this fraction of its lines are training lines
EVAL_OVERLAP_REFUSED = 0.5


@dataclass
class Corpus:
    train: datasets.Dataset
    eval: datasets.Dataset
    identity: str  # changes whenever the text can change (cache key)
    description: str
    notes: list[str] = field(default_factory=list)  # what the run should say it did to the text (one line each)
    eval_overlap: str | None = None  # allowed eval text that is training text: EVAL_IS_TRAIN and how much


# ---------------------------------------------------------------------------------- local files
def resolve_text_files(patterns: list[str], flag: str = "--train-file") -> list[Path]:
    """Expand files, directories (recursively, hidden files skipped) and globs, in sorted order."""
    return [file for file, _ in _sourced_text_files(patterns, flag)]


def _sourced_text_files(patterns: list[str], flag: str) -> list[tuple[Path, str]]:
    """`resolve_text_files`, each file with the pattern that named it."""
    files = [(file, pattern) for pattern in patterns for file in _pattern_files(pattern, flag)]
    for file, _ in files:
        check_text_file(file, flag)
    return files


def _pattern_files(pattern: str, flag: str) -> list[Path]:
    """The files one --train-file / --eval-file value names: a file, a directory's files or a glob's."""
    path = Path(pattern).expanduser()
    if path.is_dir():
        found = _files_under(path, flag)
        if not found:
            raise UsageError(f"{flag} {pattern}: the directory has no files; point at text files")
        return found
    if path.is_file():
        return [path]
    if glob.has_magic(pattern):
        found = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not found:
            raise UsageError(f"{flag} {pattern}: the pattern matches no files")
        return found
    if path.exists():
        raise UsageError(f"{flag} {pattern}: not a regular file (a FIFO, socket or device); give text files or a "
                         "directory of them")
    raise UsageError(f"{flag} {pattern}: no such file or directory")


def _files_under(directory: Path, flag: str) -> list[Path]:
    """The files under `directory` (hidden files and directories skipped), sorted; unreadable ones are named."""

    def unreadable(err: OSError) -> None:
        raise UsageError(f"{flag} {err.filename}: cannot read the directory ({err.strerror}); "
                         "fix its permissions or leave it out")

    if not os.access(directory, os.R_OK | os.X_OK):
        unreadable(PermissionError(13, os.strerror(13), str(directory)))
    found = []
    for root, subdirectories, names in os.walk(directory, onerror=unreadable):
        if record := next((n for n in RUN_RECORDS if n in names), None):
            raise UsageError(f"{flag} {directory}: {root} is a convattn run or model folder (it holds {record}), "
                             "whose files are not text; move it out of the corpus folder, or give the text files "
                             "themselves")
        subdirectories[:] = [d for d in subdirectories if not d.startswith(".")]
        found.extend(Path(root, n) for n in names if not n.startswith(".") and Path(root, n).is_file())
    return sorted(found)


def check_text_file(path: Path, flag: str) -> None:
    """Raise `UsageError` naming the file if it is unreadable, empty, blank, binary or not UTF-8 text."""
    try:
        has_text = _scan_text(path, flag)
    except OSError as err:
        raise UsageError(f"{flag} {path}: cannot read it ({err.strerror}); fix its permissions or leave it out") \
            from None
    if not has_text:
        raise UsageError(f"{flag} {path}: the file is empty; give a file with text in it")


def _scan_text(path: Path, flag: str) -> bool:
    """Whether the file holds any non-blank text; `UsageError` for binary or non-UTF-8 content."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, has_text = 0, False
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            if offset == 0 and looks_like_utf16(chunk):
                raise UsageError(f"{flag} {path}: UTF-16 text, not UTF-8; convert it, e.g. iconv -f UTF-16 -t UTF-8 "
                                 f"{path.name} > {path.stem}.utf8{path.suffix}, or leave it out")
            if (nul := chunk.find(b"\0")) >= 0:
                raise UsageError(f"{flag} {path}: a binary file, not text (a NUL byte at offset {offset + nul}); "
                                 "leave it out")
            try:
                text = decoder.decode(chunk)
            except UnicodeDecodeError as err:
                raise UsageError(
                    f"{flag} {path}: not UTF-8 text (undecodable byte at offset {offset + err.start}); "
                    "convert it to UTF-8 or leave it out"
                ) from None
            has_text = has_text or bool(text.strip())
            offset += len(chunk)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise UsageError(f"{flag} {path}: ends in the middle of a UTF-8 character; fix or leave it out") from None
    return has_text


def looks_like_utf16(start: bytes) -> bool:
    """A UTF-16 byte order mark, or (without one) ASCII text with a NUL byte beside every character."""
    if start.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return True
    sample = start[:4096]
    halves = sample[0::2], sample[1::2]
    return len(sample) >= 8 and any(half.count(0) == len(half) for half in halves) and \
        all(0 < byte < 128 for byte in (halves[1] if halves[0].count(0) == len(halves[0]) else halves[0]))


def content_digest(path: Path) -> str:
    """SHA-256 of the file's bytes (32 hex digits), read 1 MiB at a time: less than the UTF-8 check of the same files
    takes (python benchmarks/cache_key.py). Computed on every run: a key of size and
    times (ctime included) would miss an edit made within the same clock tick as the last read (file times come
    from a coarse clock, whole seconds on some filesystems), and would be stale where attributes are cached (NFS)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()[:32]


# ---------------------------------------------------------------------------------- bounded rows
_LAST_WHITESPACE = re.compile(r"\s(?=\S*\Z)")


def _cut(window: str) -> tuple[str, str]:
    """`window` (a full-length piece of a longer line) as (piece, rest): cut at its last whitespace, which is
    dropped; without any, the whole window is a piece."""
    found = _LAST_WHITESPACE.search(window)
    if found is None or found.start() == 0:
        return window, ""
    return window[:found.start()], window[found.end():]


def bounded_pieces(text: str, limit: int) -> Iterator[str]:
    """`text` split at whitespace into pieces of at most `limit` characters."""
    start = 0
    while len(text) - start > limit:
        piece, rest = _cut(text[start:start + limit])
        yield piece
        start += limit - len(rest)
    yield text[start:]


def _bounded_lines(f, limit: int) -> Iterator[str]:
    """The lines of text file `f`, read at most `limit` characters at a time, longer ones cut into pieces."""
    rest = ""
    while chunk := f.readline(limit - len(rest)):
        text, rest = rest + chunk, ""
        if text.endswith("\n") or len(text) < limit:  # a whole line (or the last piece of the file)
            yield text.removesuffix("\n")
        else:
            text, rest = _cut(text)
            yield text
    if rest:
        yield rest


def _text_rows(files: list[str], identity: str, limit: int) -> Iterator[dict]:
    """The non-blank lines of `files` ("\\n", "\\r\\n" and "\\r" end a line), cut into bounded rows;
    `identity` only keys the datasets cache."""
    for file in files:
        with open(file, encoding="utf-8") as f:
            yield from ({"text": row} for row in _bounded_lines(f, limit) if row.strip())


def _bounded_rows(rows: dict, limit: int) -> dict:
    return {"text": [piece for text in rows["text"] for piece in bounded_pieces(text, limit) if piece.strip()]}


def _load_text_files(files: list[Path], identity: str, cache_dir: Path) -> datasets.Dataset:
    """The rows of `files`, cached by `datasets` under their content (`identity`: their digests, in order)."""
    return datasets.Dataset.from_generator(
        _text_rows, features=datasets.Features({"text": datasets.Value("string")}),
        gen_kwargs={"files": [str(f) for f in files], "identity": identity, "limit": MAX_ROW_CHARS},
        cache_dir=str(cache_dir / "hf-datasets"),
    )


def _holdout(data: datasets.Dataset) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Hold out the last rows (contiguous, so no paragraph of an eval article is trained on)."""
    n_eval = max(1, min(HOLDOUT_MAX_ROWS, int(len(data) * HOLDOUT_FRACTION)))
    if len(data) < 2:
        raise UsageError(f"the corpus has fewer than 2 lines of text; give more text or an {option('eval_file')}")
    return data.select(range(len(data) - n_eval)), data.select(range(len(data) - n_eval, len(data)))


@dataclass(frozen=True)
class TextFile:
    """A text file a flag names: its path, the flag's value that named it, where it really lies, its content."""

    path: Path
    given: str
    real: str
    digest: str

    def named(self, flag: str) -> str:
        return f"{flag} {self.path}" + ("" if str(self.path) == self.given else f" (from {self.given})")

    def twin(self, others: list[TextFile]) -> tuple[TextFile, str] | None:
        """The first of `others` that is this file or holds its text, and which it is."""
        for other in others:
            if other.real == self.real:
                return other, "the same file as"
            if other.digest == self.digest:
                return other, "the same text as"
        return None


def text_files(patterns: list[str], flag: str) -> tuple[list[TextFile], str | None]:
    """The distinct files `patterns` name (checked as `resolve_text_files` does): a file named twice (the same path,
    a link to it, a glob and a file that overlap) or a copy of another's text is read once; the note says which."""
    kept: list[TextFile] = []
    dropped: list[str] = []
    for path, given in _sourced_text_files(patterns, flag):
        file = TextFile(path, given, os.path.realpath(path), content_digest(path))
        if (found := file.twin(kept)) is None:
            kept.append(file)
        else:
            dropped.append(f"{file.path} ({found[1]} {found[0].path})")
    note = None if not dropped else (f"{flag}: {len(dropped)} duplicate file(s) read once, not twice: "
                                     f"{listed(dropped)}")
    return kept, note


def check_eval_not_training(train: list[TextFile], evaluation: list[TextFile], allow: bool) -> str | None:
    """An eval file that is a training file (the same file, a link to it, the same text) is refused: its eval
    perplexity would be scored on text the model trains on. With `allow`, what the run records instead."""
    for file in evaluation:
        if (found := file.twin(train)) is not None:
            twin, how = found
            if not allow:
                raise UsageError(
                    f"{file.named(option('eval_file'))} is {how} {twin.named(option('train_file'))}: {EVAL_IS_TRAIN}, "
                    f"so its perplexity would be scored on text the model trains on; give held-out text, leave out "
                    f"{option('eval_file')} (the last 1% of the train text is held out), or add "
                    f"{option('allow_eval_overlap')} to score on training text anyway")
            return f"{EVAL_IS_TRAIN} ({file.path} is {how} {twin.path})"
    return None


def check_text_flags(train_patterns: list[str], eval_patterns: list[str], allow_eval_overlap: bool = False) -> None:
    """Every file the flags name is text, and no eval file is a training file: said before anything runs (the
    lines are compared once the text is read)."""
    train = text_files(train_patterns, "--train-file")[0] if train_patterns else []
    evaluation = text_files(eval_patterns, "--eval-file")[0] if eval_patterns else []
    check_eval_not_training(train, evaluation, allow_eval_overlap)


def eval_lines_in_training(train: datasets.Dataset, evaluation: datasets.Dataset) -> tuple[int, int]:
    """(eval rows that are also training rows, eval rows)."""
    wanted = set(evaluation["text"])
    found = set()
    for batch in train.iter(batch_size=10_000):
        found.update(wanted.intersection(batch["text"]))
    return sum(row in found for row in evaluation["text"]), len(evaluation)


def check_eval_lines(train: datasets.Dataset, evaluation: datasets.Dataset, eval_patterns: list[str],
                     train_source: str, allow: bool) -> tuple[str | None, str | None]:
    """Eval text whose lines are mostly training lines (a copy with a line added, a file cut out of a training
    file) is refused as the same file is; a few shared lines (headings, boilerplate) are counted and said. Returns
    (the note to say, what the run records with `allow`)."""
    shared, rows = eval_lines_in_training(train, evaluation)
    if not shared:
        return None, None
    counted = f"{shared:,} of the {rows:,} eval lines ({shared / rows:.0%}) are also in the training text"
    if shared <= EVAL_OVERLAP_REFUSED * rows:
        return f"eval: {counted} (repeated lines such as headings); the eval perplexity includes them", None
    if not allow:
        raise UsageError(
            f"{option('eval_file')} {', '.join(eval_patterns)}: {counted} ({train_source}): {EVAL_IS_TRAIN}, so its "
            f"perplexity would be scored on text the model trains on; give held-out text, leave out "
            f"{option('eval_file')} (the last 1% of the train text is held out), or add "
            f"{option('allow_eval_overlap')} to score on training text anyway")
    recorded = f"{EVAL_IS_TRAIN} ({counted})"
    return f"eval: {recorded}, as --allow-eval-overlap allows", recorded


def local_corpus(train_patterns: list[str], eval_patterns: list[str], cache_dir: Path,
                 allow_eval_overlap: bool = False) -> Corpus:
    train_files, train_note = text_files(train_patterns, "--train-file")
    eval_files, eval_note = text_files(eval_patterns, "--eval-file") if eval_patterns else ([], None)
    overlap = check_eval_not_training(train_files, eval_files, allow_eval_overlap)
    train_identity = ";".join(file.digest for file in train_files)
    eval_identity = ";".join(file.digest for file in eval_files)
    train = _load_text_files([file.path for file in train_files], train_identity, cache_dir)
    notes = [note for note in (train_note, eval_note) if note]
    if eval_files:
        evaluation = _load_text_files([file.path for file in eval_files], eval_identity, cache_dir)
        note, lines_overlap = check_eval_lines(train, evaluation, eval_patterns,
                                               f"{option('train_file')} {', '.join(train_patterns)}",
                                               allow_eval_overlap)
        if overlap:  # the same file: said as such, whatever its lines
            note = f"eval: {overlap}, as --allow-eval-overlap allows"
        notes += [note] if note else []
        overlap = overlap or lines_overlap
    else:
        train, evaluation = _holdout(train)
    identity = f"files[{train_identity}]eval[{eval_identity}]rows[{MAX_ROW_CHARS}]"
    described = f"{len(train_files)} file(s) from {', '.join(train_patterns)}"
    return Corpus(train, evaluation, identity, described, notes, overlap)


# ---------------------------------------------------------------------------------- the hub
def hub_corpus(name: str, config: str | None, eval_patterns: list[str], cache_dir: Path,
               allow_eval_overlap: bool = False) -> Corpus:
    eval_files, eval_note = text_files(eval_patterns, "--eval-file") if eval_patterns else ([], None)
    eval_identity = ";".join(file.digest for file in eval_files)
    try:
        splits = load_hub_dataset(name, config, cache_dir=str(cache_dir / "hf-datasets"))
    except Exception as err:  # offline, unknown name, gated: the hub's errors vary by version
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(
            f"cannot load dataset {name!r}{f' ({config})' if config else ''} from the HuggingFace hub "
            f"[{reason[:160]}]; to train without the hub, point at local text with {option('train_file')} PATH "
            f"[{option('eval_file')} PATH], or omit {option('dataset')} for the embedded default"
        ) from None
    if "train" not in splits:
        raise UsageError(f"dataset {name!r} has no 'train' split (it has {', '.join(splits)})")
    if "text" not in splits["train"].column_names:
        raise UsageError(f"dataset {name!r} has no 'text' column (it has {', '.join(splits['train'].column_names)})")
    bounded = dict(batched=True, fn_kwargs={"limit": MAX_ROW_CHARS}, remove_columns=["text"],
                   desc="splitting long rows")
    train = splits["train"].select_columns(["text"]).map(_bounded_rows, **bounded)
    eval_split = next((s for s in ("validation", "valid", "test") if s in splits), None)
    notes, overlap = [eval_note] if eval_note else [], None
    if eval_files:
        evaluation = _load_text_files([file.path for file in eval_files], eval_identity, cache_dir)
        note, overlap = check_eval_lines(train, evaluation, eval_patterns, f"{option('dataset')} {name}",
                                         allow_eval_overlap)
        notes += [note] if note else []
    elif eval_split:
        evaluation = splits[eval_split].select_columns(["text"]).map(_bounded_rows, **bounded)
    else:
        train, evaluation = _holdout(train)
    identity = f"hub[{name}:{config}:{train._fingerprint}]eval[{eval_identity}:{eval_split}]"
    return Corpus(train, evaluation, identity, f"{name}{f' ({config})' if config else ''} from the hub", notes,
                  overlap)


# ---------------------------------------------------------------------------------- embedded default
def _paragraphs(docstring: str) -> Iterator[str]:
    for block in re.split(r"\n\s*\n", docstring):
        text = " ".join(block.split())
        words = text.split()
        letters = sum(c.isalpha() or c.isspace() for c in text)
        if len(words) >= 8 and letters >= 0.8 * len(text) and not text.startswith((">>>", "..", "-", "=")):
            yield text


def _docstrings(path: Path) -> Iterator[str]:
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError, OSError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc:
                yield from _paragraphs(doc)


def _documentation_sources() -> Iterator[tuple[str, Iterator[str]]]:
    """(source name, its paragraphs), in a fixed order: pydoc topics, stdlib, then packages."""
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield f"pydoc:{key}", _paragraphs(topics[key])
    roots = [("stdlib", Path(sysconfig.get_paths()["stdlib"]))]
    for package in EMBEDDED_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec and spec.origin:
            roots.append((package, Path(spec.origin).parent))
    skip = {"test", "tests", "testing", "site-packages", "idlelib", "_vendor", "externals", "__pycache__"}
    for name, root in roots:
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(root)
            if not skip & set(relative.parts):
                yield f"{name}:{relative.as_posix()}", _docstrings(path)


def build_embedded_text(directory: Path) -> tuple[Path, Path]:
    """Write the embedded corpus to `directory`/{train,eval}.txt (one paragraph per line)."""
    seen: set[str] = set()
    train_file, eval_file = directory / "train.txt", directory / "eval.txt"
    with open(train_file, "w", encoding="utf-8") as train, open(eval_file, "w", encoding="utf-8") as evaluation:
        for source, paragraphs in _documentation_sources():
            out = evaluation if zlib.crc32(source.encode()) % EMBEDDED_EVAL_EVERY == 0 else train
            for paragraph in paragraphs:
                key = paragraph.lower()
                if key not in seen:
                    seen.add(key)
                    out.write(paragraph + "\n")
    return train_file, eval_file


def embedded_corpus(cache_dir: Path) -> Corpus:
    version = f"v{EMBEDDED_VERSION}-py{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    packages = [f"{p}-{_version(p)}" for p in EMBEDDED_PACKAGES]
    key = zlib.crc32("|".join([version, sysconfig.get_paths()["stdlib"], *packages]).encode())
    directory = cache_entry(cache_dir / "embedded" / f"{version}-{key:08x}", build_embedded_text, "embedded corpus")
    train_file, eval_file = directory / "train.txt", directory / "eval.txt"
    corpus = local_corpus([str(train_file)], [str(eval_file)], cache_dir)
    size = train_file.stat().st_size / 1e6
    corpus.description = f"embedded default (installed documentation: Python {sys.version.split()[0]}, " \
                         f"{', '.join(packages)}; {size:.1f} MB)"
    return corpus


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version({"sklearn": "scikit-learn"}.get(package, package))
    except PackageNotFoundError:
        return "absent"


def load_corpus(dataset: str | None, dataset_config: str | None, train_files: list[str], eval_files: list[str],
                cache_dir: Path, allow_eval_overlap: bool = False) -> Corpus:
    """The corpus the flags name: --dataset, --train-file, or (neither) the embedded default."""
    if dataset and train_files:
        raise UsageError(f"give either {option('dataset')} or {option('train_file')}, not both")
    if eval_files and not (dataset or train_files):
        raise UsageError(f"{option('eval_file')} needs {option('train_file')} or {option('dataset')} (the embedded "
                         "default has its own eval split)")
    cache_dir = check_cache_dir(cache_dir)
    if dataset:
        return hub_corpus(dataset, dataset_config, eval_files, cache_dir, allow_eval_overlap)
    if train_files:
        return local_corpus(train_files, eval_files, cache_dir, allow_eval_overlap)
    return embedded_corpus(cache_dir)
