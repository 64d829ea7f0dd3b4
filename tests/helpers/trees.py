"""Every file of a folder tree, hashed without following anything, and run folders as convattn leaves them, for the
tests that what convattn refuses stays as it was, inside the run folder and outside it."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

KINDS = {stat.S_IFCHR: "character device", stat.S_IFBLK: "block device", stat.S_IFIFO: "named pipe",
         stat.S_IFSOCK: "socket"}

# what each job leaves in its folder once finished (the files' content does not matter to the checks)
FINISHED = {
    "glue": {
        "glue_model.json": "{}", "glue_results.json": "{}", "glue_results.md": "# GLUE\n", "log.txt": "lines\n",
        "runs/sst2/seed0/run.json": "{}", "runs/sst2/seed0/log.json": "[]",
        "runs/sst2/seed0/predictions/SST-2.tsv": "index\tprediction\n0\t1\n",
        "submission/SST-2.tsv": "index\tprediction\n0\t1\n",
        "models/sst2/config.json": "{}", "models/sst2/model.safetensors": "weights",
        "models/sst2/fine_tuned.json": "{}",
    },
    "squad": {
        "squad_model.json": "{}", "squad_results.json": "{}", "squad_results.md": "# SQuAD\n", "log.txt": "lines\n",
        "runs/squad1.1/seed0/run.json": "{}", "runs/squad1.1/seed0/predictions.json": "{}",
        "models/squad1.1/config.json": "{}", "models/squad1.1/model.safetensors": "weights",
    },
    "pretrain": {
        "pretrain_options.json": "{}", "metrics.jsonl": "", "log.txt": "lines\n",
        "checkpoints/checkpoint-2/trainer_state.json": "{}", "checkpoints/checkpoint-2/model.safetensors": "weights",
        "tensorboard/events.out.tfevents.1.host": "events",
    },
}


def write_files(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def finished_run(folder: Path, job: str) -> Path:
    """A folder as a finished `job` (glue, squad, pretrain) leaves it."""
    return write_files(folder, FINISHED[job])


def tree(root: Path) -> dict[str, str]:
    """Every entry under `root`, following no link: a file's sha256, a link's target, a folder, a special file's
    kind."""
    found = {}
    for folder, folders, files in os.walk(root):  # a link to a folder is listed, not entered
        for name in folders + files:
            path = Path(folder) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                found[str(path.relative_to(root))] = f"link to {os.readlink(path)}"
            elif stat.S_ISREG(mode):
                found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[str(path.relative_to(root))] = "folder" if stat.S_ISDIR(mode) else KINDS[stat.S_IFMT(mode)]
    return found
