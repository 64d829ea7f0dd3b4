"""SQuAD v1.1 and v2.0 questions: the official JSON layout (local files) or the HF hub, as one `Dataset`.

Every split has the hub's columns: id, title, context, question, answers = {"text": [...], "answer_start": [...]}
(an unanswerable v2.0 question has empty lists). Local files are checked while they are read: the layout, and an
unanswerable question that carries answers. The answers of both sources, local and hub, are checked alike
(`checked_answers`): a training answer whose answer_start misses its text is left out, and said; a dev answer that
occurs nowhere in its context (the official dev sets have a few, typos) is counted and said, since the official
evaluation scores it as given; a file where many do is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from datasets import Dataset

from convattn.console import say
from convattn.data.hub_access import load_hub_dataset
from convattn.errors import UsageError, option

VERSIONS = ("1.1", "2.0")
# the longest context read: 13x SQuAD's longest; its windows cost minutes (a 2 MB context: 135,000 windows)
MAX_CONTEXT_CHARACTERS = 50_000
# training questions whose answers all miss their answer_start are skipped, up to this share of the file; dev
# questions none of whose answers occur in their context are scored as given, up to this share
MAX_SKIPPED_FRACTION = 0.05
HUB_DATASETS = {"1.1": "rajpurkar/squad", "2.0": "rajpurkar/squad_v2"}
HUB_SPLITS = {"train": "train", "dev": "validation"}
COLUMNS = ("id", "title", "context", "question", "answers")


def check_version(version: str) -> str:
    if version not in VERSIONS:
        raise UsageError(f"{option('version')} must be one of {', '.join(VERSIONS)}, got {version!r}")
    return version


def read_squad_json(path: Path) -> dict:
    """The parsed official JSON file (UsageError, one line, when it is missing, empty or not JSON)."""
    path = Path(path)
    check_regular_file(path)
    text = path.read_bytes()
    if not text.strip():
        raise UsageError(f"{path}: the file is empty; expected SQuAD JSON ({{\"data\": [...]}})")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{path}: not JSON ({err}); expected the official SQuAD layout") from None
    except RecursionError:
        raise UsageError(f"{path}: JSON nested deeper than Python reads (the SQuAD layout is 5 levels deep); expected "
                         "the official SQuAD layout") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise UsageError(f"{path}: not in the SQuAD layout: expected a JSON object with a \"data\" list of articles")
    return data


def check_regular_file(path: Path) -> None:
    """One line for a path that is not a file to read: missing, a directory, a FIFO or a device."""
    if path.is_file():
        return
    if path.is_dir():
        raise UsageError(f"{path}: a directory; give the SQuAD JSON file itself, not its folder")
    if path.exists():
        raise UsageError(f"{path}: not a regular file (a FIFO, socket or device); give the SQuAD JSON file")
    raise UsageError(f"{path}: no such file")


def shorten(text: str, width: int = 60) -> str:
    return repr(text if len(text) <= width else text[:width] + "...")


def answer_end(context: str, start: int, text: str) -> int | None:
    """Where the answer `text` ends in the context when it starts at `start`, whitespace aside (the official dev
    sets have answers whose spaces differ from the context's); None when the characters do not match."""
    position = start
    for char in text:
        if char.isspace():
            continue
        while position < len(context) and context[position].isspace():
            position += 1
        if position >= len(context) or context[position] != char or (position == start and start < 0):
            return None
        position += 1
    return position if text.strip() and 0 <= start < len(context) else None


def file_version(data: dict) -> str | None:
    """The SQuAD version a file says it is ("version": "1.1" / "v2.0"); None when it does not say."""
    version = data.get("version")
    return str(version).lstrip("v") if isinstance(version, str | int | float) else None


def check_file_version(data: dict, version: str, source: str) -> None:
    """A v1.1 file read as --version 2.0 (or the reverse) is refused: its "version" field, or, without one, the
    absence of any "is_impossible" field, tells."""
    said = file_version(data)
    if data.get("version") is not None and said not in VERSIONS:
        raise UsageError(f"{source}: its \"version\" is {data['version']!r}, which convattn does not read; SQuAD "
                         f"files say \"1.1\" or \"v2.0\" (the versions of {option('version')}: "
                         f"{', '.join(VERSIONS)})")
    if said in VERSIONS and said != version:
        raise UsageError(f"{source} is a SQuAD {said} file (its \"version\" is {data['version']!r}); use "
                         f"{option('version')} {said}")
    if said is None and version == "2.0" and not any("is_impossible" in qa for _, _, qa in
                                                     question_entries(data, source)):
        raise UsageError(f"{source} has no \"is_impossible\" field in any question: a SQuAD 1.1 file; use "
                         f"{option('version')} 1.1 (or add the v2.0 fields)")


def mismatch(context: str, start: int, text: str) -> str:
    """Where an answer and the context at its answer_start part ways, shown from a few characters before."""
    offset = next((k for k, char in enumerate(text) if start + k >= len(context) or context[start + k] != char),
                  len(text))
    begin = max(0, offset - 10)
    return (f"{shorten(text)}: they differ from its character {offset} on (answer {text[begin:offset + 10]!r}, "
            f"context {context[max(0, start) + begin:max(0, start) + offset + 10]!r})")


def _answers(qa: dict, where: str, version: str) -> dict[str, list]:
    """The question's answers, checked for the layout."""
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise UsageError(f"{where}: \"is_impossible\" must be true or false, got {impossible!r}")
    if impossible and version == "1.1":
        raise UsageError(f"{where}: is_impossible questions are SQuAD 2.0; use {option('version')} 2.0")
    if not impossible and "answers" not in qa:
        raise UsageError(f"{where}: no \"answers\" list (an unanswerable SQuAD 2.0 question has \"is_impossible\": "
                         "true)")
    answers = qa.get("answers", [])
    if not isinstance(answers, list):
        raise UsageError(f"{where}: \"answers\" must be a list of {{\"text\", \"answer_start\"}} objects, got "
                         f"{json.dumps(answers)[:40]}")
    if impossible and answers:  # the official files keep an unanswerable question's spans in "plausible_answers"
        raise UsageError(f"{where}: \"is_impossible\" is true but the question has {len(answers)} answer(s); set "
                         "\"is_impossible\": false if they answer it, or move them to \"plausible_answers\" (the "
                         "official SQuAD 2.0 layout)")
    if not answers and not impossible:
        raise UsageError(f"{where}: no answers (a SQuAD 2.0 unanswerable question needs \"is_impossible\": true)")
    texts, starts = [], []
    for answer in answers:
        text, start = (answer.get("text"), answer.get("answer_start")) if isinstance(answer, dict) else (None, None)
        if not isinstance(text, str) or not isinstance(start, int) or isinstance(start, bool):
            raise UsageError(f"{where}: every answer needs a string \"text\" and an integer \"answer_start\"")
        texts.append(text)
        starts.append(start)
    return {"text": texts, "answer_start": starts}


def without_spaces(text: str) -> str:
    return "".join(text.split())


def checked_answers(columns: dict[str, list], source: str, training: bool) -> dict[str, list]:
    """The questions' answers checked against their contexts, the same for a local file and the hub. Training: an
    answer whose answer_start misses its text is left out (it would train on another span), a question left with
    none skipped, as BERT's and ELECTRA's SQuAD code do, and both said; refused past MAX_SKIPPED_FRACTION of the
    questions. Dev (scored on answer texts only): answers that occur nowhere in their context, whitespace aside,
    are counted and said, as the official evaluation scores them as given; refused past the same share."""
    total = len(columns["id"])
    if training:
        keep, misses = [], []
        for k, (qid, context, answers) in enumerate(zip(columns["id"], columns["context"], columns["answers"],
                                                        strict=True)):
            good = [(text, start) for text, start in zip(answers["text"], answers["answer_start"], strict=True)
                    if answer_end(context, start, text) is not None]
            misses += [f"{source}: question {qid!r}: answer_start {start} does not point at the answer "
                       f"{mismatch(context, start, text)}"
                       for text, start in zip(answers["text"], answers["answer_start"], strict=True)
                       if (text, start) not in good]
            if answers["text"] and not good:
                continue  # no answer left to train on: skipped (not turned into an unanswerable question)
            answers["text"], answers["answer_start"] = [t for t, _ in good], [s for _, s in good]
            keep.append(k)
        skipped = total - len(keep)
        if skipped > MAX_SKIPPED_FRACTION * total:
            raise UsageError(f"{misses[0]}; {skipped} of {total} questions have no answer that their answer_start "
                             f"points at (at most {MAX_SKIPPED_FRACTION:.0%} are skipped)")
        if misses:
            say("squad", f"{source}: {len(misses)} answer(s) whose answer_start misses their text left out; "
                         f"{skipped} question(s) without another answer skipped (first: {misses[0]})")
        return columns if skipped == 0 else {name: [values[k] for k in keep] for name, values in columns.items()}
    spaceless: dict[str, str] = {}
    nowhere, unmatched, first = 0, 0, None
    for qid, context, answers in zip(columns["id"], columns["context"], columns["answers"], strict=True):
        if context not in spaceless:
            spaceless[context] = without_spaces(context)
        found = [without_spaces(text) in spaceless[context] for text in answers["text"]]
        nowhere += found.count(False)
        if found and not any(found):
            unmatched += 1
        if first is None and not all(found):
            first = f"question {qid!r}, answer {shorten(answers['text'][found.index(False)])}"
    if unmatched > MAX_SKIPPED_FRACTION * total:
        raise UsageError(f"{source}: {unmatched} of {total} questions have no answer that occurs in their context "
                         f"(first: {first}); the answers are not from these contexts: check that the file's answers "
                         "and contexts belong together")
    if nowhere:
        say("squad", f"{source}: {nowhere} dev answer(s) occur nowhere in their context ({unmatched} question(s) "
                     f"without one that does: no exact match possible), scored as given, as the official evaluation "
                     f"does; the official dev sets have a few (first: {first})")
    return columns


def question_entries(data: dict, source: str):
    """(title, context, question object) for every question of the file, each checked for the layout."""
    for a, article in enumerate(data["data"]):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise UsageError(f"{source}: article {a} must be an object with a \"paragraphs\" list")
        title = str(article.get("title", ""))
        for p, paragraph in enumerate(article["paragraphs"]):
            where = f"{source}: article {a}, paragraph {p}"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str) or \
                    not isinstance(paragraph.get("qas"), list):
                raise UsageError(f"{where}: needs a \"context\" string and a \"qas\" list")
            context = paragraph["context"]
            if len(context) > MAX_CONTEXT_CHARACTERS:
                raise UsageError(f"{where}: the context has {len(context):,} characters; convattn reads contexts of "
                                 f"up to {MAX_CONTEXT_CHARACTERS:,} (SQuAD's longest has about 3,700): split it into "
                                 "paragraphs")
            for qa in paragraph["qas"]:
                if not isinstance(qa, dict):
                    raise UsageError(f"{where}: every entry of \"qas\" must be a question object, got "
                                     f"{json.dumps(qa)[:40]}")
                yield title, context, qa


def squad_rows(data: dict, version: str, source: str, training: bool) -> dict[str, list]:
    """The official layout -> columns; every question is checked (UsageError naming the question), its answers
    against its context as `checked_answers` says."""
    check_file_version(data, version, source)
    columns: dict[str, list] = {name: [] for name in COLUMNS}
    for title, context, qa in question_entries(data, source):
        where = f"{source}: question {qa.get('id', '?')!r}"
        if not isinstance(qa.get("id"), str) or not isinstance(qa.get("question"), str):
            raise UsageError(f"{where}: every question needs a string \"id\" and \"question\"")
        if not qa["question"].strip():  # refused, not skipped: the official evaluation counts every dev question
            raise UsageError(f"{where}: the question is {'whitespace only' if qa['question'] else 'empty'} (the "
                             "official SQuAD files have none); write its text, or remove the question")
        columns["answers"].append(_answers(qa, where, version))
        columns["id"].append(qa["id"])
        columns["title"].append(title)
        columns["context"].append(context)
        columns["question"].append(qa["question"])
    if not columns["id"]:
        raise UsageError(f"{source}: no questions in the file")
    columns = checked_answers(columns, source, training)
    columns["id"], renamed = unique_ids(columns["id"])
    if renamed:
        say("squad", f"{source}: {renamed} question ids repeat an earlier question's; renamed <id>#<k> so each "
                     "question gets its own answer in predictions.json")
    return columns


def unique_ids(ids: list[str]) -> tuple[list[str], int]:
    """Question ids with every repeat renamed `<id>#<k>` (the lowest k = 1, 2, ... not taken), and how many
    were renamed."""
    taken: set[str] = set()
    unique, renamed = [], 0
    for qid in ids:
        name, k = qid, 0
        while name in taken:
            k += 1
            name = f"{qid}#{k}"
        taken.add(name)
        unique.append(name)
        renamed += k > 0
    return unique, renamed


def load_squad_file(path: Path, version: str, split: str = "train") -> Dataset:
    return Dataset.from_dict(squad_rows(read_squad_json(path), check_version(version), str(path),
                                        training=split == "train"))


def load_squad_hub(version: str, split: str) -> Dataset:

    name = HUB_DATASETS[check_version(version)]
    try:
        dataset = load_hub_dataset(name, split=HUB_SPLITS[split])
    except Exception as err:  # offline, not cached, hub errors: all mean the same to the user
        raise UsageError(f"could not load {name} ({HUB_SPLITS[split]}) from the HF hub ({type(err).__name__}); "
                         f"pass {option('train_file')} and {option('dev_file')} with SQuAD {version} JSON "
                         "files") from err
    columns = dataset.select_columns(list(COLUMNS)).to_dict()
    return Dataset.from_dict(checked_answers(columns, f"{name} ({HUB_SPLITS[split]})", training=split == "train"))


def load_squad(version: str, split: str, file: Path | None) -> Dataset:
    """One split ("train" or "dev") from a local official-layout file or, when file is None, from the HF hub."""
    return load_squad_file(file, version, split) if file is not None else load_squad_hub(version, split)


def official_answers(dataset: Dataset) -> dict[str, list[str]]:
    """question id -> reference answer texts (empty for an unanswerable question), as the scorers read them."""
    return {qid: answers["text"] for qid, answers in zip(dataset["id"], dataset["answers"], strict=True)}
