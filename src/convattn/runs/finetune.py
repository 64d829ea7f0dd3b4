"""A fine-tuning job's folder (glue, squad): the files it writes, at any depth, what --overwrite may replace and
when a replacement stands (its first finished seed), and where a comparison fine-tunes each of its pretraining
seeds (`<seed folder>/glue/`, `<seed folder>/squad/`).

    glue_model.json / squad_model.json     the model every seed of the folder fine-tuned (written first)
    glue_results.json, glue_results.md     (squad_results.*) every finished seed, aggregated
    submission/<TASK>.tsv                  glue: the best dev seed's test predictions
    runs/<task>/seed<k>/                   one seed: run.json (written last), log.json, predictions, model/
    models/<task>/                         the best dev seed's model, its record and model card
    log.txt                                the libraries' output

Only these names are the job's: a task folder of another name, a prediction file another task's or of another
name, is a user's file, which --overwrite refuses (it removes only what the job wrote, at any depth).
"""

from __future__ import annotations

import re
from pathlib import Path

from convattn.console import LOG_FILE
from convattn.errors import option
from convattn.files import staging_target
from convattn.runs.folder import (
    LOCK_FILE,
    PARTIAL,
    REPLACED,
    check_only_own_files,
    foreign_entries,
    is_code_or_temp,
)
from convattn.runs.pretrain import GLUE_DIR, MODEL_FILES, SQUAD_DIR, is_model_card
from convattn.runs.replace import JobLayout

GLUE_RESULTS = "glue_results.json"
SQUAD_RESULTS = "squad_results.json"
GLUE_MODEL_RECORD = "glue_model.json"
SQUAD_MODEL_RECORD = "squad_model.json"
SEED_RUN_FILE = "run.json"  # written last: a seed folder without it is an interrupted seed
PUBLISHED_RECORD = "fine_tuned.json"  # beside a published model: its task, seed and dev scores

# what a job writes at the top of its folder
GLUE_ENTRIES = frozenset({GLUE_MODEL_RECORD, GLUE_RESULTS, "glue_results.md", "submission", "runs", "models"})
SQUAD_ENTRIES = frozenset({SQUAD_MODEL_RECORD, SQUAD_RESULTS, "squad_results.md", "runs", "models"})
COMMON_ENTRIES = frozenset({LOG_FILE, LOCK_FILE, REPLACED, PARTIAL})
# the tasks of each job (runs/<task>/, models/<task>/): GLUE's with the test predictions each writes (into its
# seeds' predictions/ and submission/), as convattn.data.glue.TASKS says; SQuAD's versions
GLUE_PREDICTIONS = {
    "cola": ("CoLA.tsv",), "sst2": ("SST-2.tsv",), "mrpc": ("MRPC.tsv",), "stsb": ("STS-B.tsv",), "qqp": ("QQP.tsv",),
    "mnli": ("MNLI-m.tsv", "MNLI-mm.tsv"), "qnli": ("QNLI.tsv",), "rte": ("RTE.tsv",), "wnli": ("WNLI.tsv",),
    "ax": ("AX.tsv",),
}
SUBMISSION_FILES = frozenset(file for files in GLUE_PREDICTIONS.values() for file in files)
SQUAD_TASKS = frozenset({"squad1.1", "squad2.0"})
# what a seed's folder holds (glue and squad)
SEED_FILES = frozenset({SEED_RUN_FILE, "log.json", "predictions.json", "nbest_predictions.json", "null_odds.json"})
SEED_FOLDERS = frozenset({"predictions", "model", "model.partial"})
SEED_NAME = re.compile(r"seed\d+")


def glue_dir(pretraining_seed: Path) -> Path:
    return Path(pretraining_seed) / GLUE_DIR


def squad_dir(pretraining_seed: Path) -> Path:
    return Path(pretraining_seed) / SQUAD_DIR


def has_finished_seed(out: Path) -> bool:
    """The folder holds a finished seed (a replacement stands once it has one)."""
    return any(Path(out).glob(f"runs/*/seed*/{SEED_RUN_FILE}"))


def _written_at_top(entry: Path, top: frozenset[str]) -> bool:
    """Whether an entry at the top of a fine-tuning folder is one the job writes (`top`: the job's entries)."""
    return entry.name in top or entry.name in COMMON_ENTRIES or (is_code_or_temp(entry.name) and entry.is_file())


def _tasks(job: str) -> frozenset[str]:
    return frozenset(GLUE_PREDICTIONS) if job == "glue" else SQUAD_TASKS


def written_inside_job(job: str):
    top, tasks = (GLUE_ENTRIES if job == "glue" else SQUAD_ENTRIES), _tasks(job)

    def written_inside(entry: Path, out: Path) -> bool:
        """Whether an entry at any depth of a fine-tuning folder is one the job writes (a user's notes are not)."""
        parts, name = entry.relative_to(out).parts, entry.name
        if len(parts) == 1:
            return _written_at_top(entry, top)
        if (is_code_or_temp(name) and entry.is_file()) or parts[0] in (REPLACED, PARTIAL):
            return True
        first, depth, folder = parts[0], len(parts), entry.is_dir()
        if first == "submission":
            return depth == 2 and entry.is_file() and name in SUBMISSION_FILES
        if first == "models":  # models/<task>/, or the folder it is staged in (a kill can leave one)
            if depth == 2:
                return folder and (name in tasks or staging_target(name) in tasks)
            return depth == 3 and entry.is_file() and _published_file(entry)
        if first != "runs":
            return False
        if depth <= 3:  # runs/<task>/seed<k>
            return folder and (name in tasks if depth == 2 else SEED_NAME.fullmatch(name) is not None)
        if depth == 4:
            return (folder and name in SEED_FOLDERS) or (entry.is_file() and name in SEED_FILES)
        return depth == 5 and entry.is_file() and (
            name in GLUE_PREDICTIONS.get(parts[1], ()) if parts[3] == "predictions" else name in MODEL_FILES)
    return written_inside


def _published_file(entry: Path) -> bool:
    name = entry.name
    return name in MODEL_FILES or name == PUBLISHED_RECORD or (name == "README.md" and is_model_card(entry))


def _is_published_file(entry: Path) -> bool:
    """A plain file of a published model, or the temporary file of one being written."""
    return entry.is_file() and not entry.is_symlink() and (_published_file(entry) or is_code_or_temp(entry.name))


def layout(job: str) -> JobLayout:
    """The `JobLayout` of a glue or squad folder (what --overwrite moves aside and gives back)."""
    top = GLUE_ENTRIES if job == "glue" else SQUAD_ENTRIES
    record = GLUE_MODEL_RECORD if job == "glue" else SQUAD_MODEL_RECORD
    return JobLayout(job, record, lambda entry: _written_at_top(entry, top), has_finished_seed,
                     "its first finished seed", written_inside_job(job), lambda out: staging_leftovers(out, job))


def foreign_files(out: Path, job: str) -> list[str]:
    """What a glue or squad folder holds that the job does not write, at any depth, relative to `out`."""
    return foreign_entries(out, written_inside_job(job))


def staging_leftovers(out: Path, job: str) -> list[Path]:
    """The folders a publish of models/<task>/ was filling when it was killed (named as `staging_dir` names them,
    holding only a published model's files): the job's own, which its next run removes."""
    models, tasks = Path(out) / "models", _tasks(job)
    if not models.is_dir() or models.is_symlink():
        return []
    return [folder for folder in sorted(models.iterdir())
            if staging_target(folder.name) in tasks and folder.is_dir() and not folder.is_symlink()
            and all(_is_published_file(entry) for entry in folder.iterdir())]


def check_restartable(out: Path, job: str, seed_folders: list[Path]) -> None:
    """What a job removes as it goes holds only what the job wrote: the folders of interrupted seeds (removed to
    start them again), models/ (a published model is replaced by a better seed's) and the seeds' model/ folders
    (removed once the best is published). A user's file inside one is refused by name, before anything is
    written."""
    out = Path(out)
    folders = [*seed_folders, out / "models", *out.glob("runs/*/seed*/model")]
    prefixes = [str(Path(folder).relative_to(out)) + "/" for folder in folders if Path(folder).is_dir()]
    if prefixes and (foreign := [f for f in foreign_files(out, job) if f.startswith(tuple(prefixes))]):
        check_only_own_files(out, foreign, option("output_dir"))


def reused_seeds(what: str, seeds: int, pending: list[int], out: Path) -> str | None:
    """The line naming the seeds of `what` that a rerun reuses from `out` (finished there), or None when every seed
    is trained now: a reused seed's scores enter the results, so the run says which."""
    reused = [s for s in range(seeds) if s not in pending]
    if not reused:
        return None
    names = f"seed {reused[0]}" if len(reused) == 1 else f"seeds {', '.join(map(str, reused))}"
    if not pending:
        return f"{what}: all {seeds} seeds already finished in {out} ({names}), reused: nothing to train"
    return (f"{what}: {names} already finished in {out}, reused as they are (their scores enter the results); "
            f"training {'seed' if len(pending) == 1 else 'seeds'} {', '.join(map(str, pending))}")
