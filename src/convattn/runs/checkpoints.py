"""A pretraining run's checkpoints read back for --resume: whether one is whole (`checkpoint_damage`), whether it
fits the run's model (`checkpoint_misfit`), and what a callback saved in its trainer state."""

from __future__ import annotations

import zipfile
from pathlib import Path

from convattn.errors import UsageError, option
from convattn.files import check_weight_file, read_json, weight_shapes
from convattn.runs.pretrain import FINAL_MODEL, RNG_STATE, TRAINER_STATE, checkpoint_step

# what --resume reads from a checkpoint besides rng_state*.pth: without one it would continue differently
CHECKPOINT_NEEDS = (FINAL_MODEL, "optimizer.pt", "scheduler.pt", TRAINER_STATE)


def is_whole(file: Path) -> bool:
    """A safetensors file (finite weights) or a torch file (a zip archive) that reads back completely."""
    if file.suffix == ".safetensors":
        try:
            check_weight_file(file)
        except UsageError:
            return False
        return True
    try:
        with zipfile.ZipFile(file) as archive:
            return archive.testzip() is None
    except (zipfile.BadZipFile, OSError, EOFError):
        return False


def checkpoint_damage(checkpoint: Path) -> str | None:
    """What keeps --resume from continuing exactly where `checkpoint` stopped (a file missing, truncated or
    corrupt), or None when it is whole."""
    missing = [name for name in CHECKPOINT_NEEDS if not (checkpoint / name).is_file()]
    rng_states = sorted(p for p in checkpoint.iterdir() if RNG_STATE.fullmatch(p.name))
    if missing or not rng_states:
        return f"{(missing or ['rng_state.pth'])[0]} is missing"
    state = read_json(checkpoint / TRAINER_STATE, damaged_as_none=True)
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        return f"{TRAINER_STATE} is not a trainer state"
    if state["global_step"] != checkpoint_step(checkpoint):
        return (f"its {TRAINER_STATE} is at step {state['global_step']}, not {checkpoint_step(checkpoint)}: a copied "
                "or renamed folder")
    for file in (checkpoint / FINAL_MODEL, checkpoint / "optimizer.pt", checkpoint / "scheduler.pt",
                 *rng_states):
        if not is_whole(file):
            return f"{file.name} is truncated or corrupt"
    return None


def check_checkpoint(checkpoints: list[Path]) -> None:
    """The last checkpoint is whole; else one line naming the damage and the way on (an earlier whole checkpoint
    to resume from, once the damaged one is deleted, or starting again)."""
    damage = checkpoint_damage(checkpoints[-1])
    if damage is None:
        return
    earlier = next((c for c in reversed(checkpoints[:-1]) if checkpoint_damage(c) is None), None)
    raise UsageError(f"{option('resume')}: {checkpoints[-1]} is damaged ({damage}); {way_on(earlier)}")


def way_on(earlier: Path | None) -> str:
    """What to do about a last checkpoint --resume cannot continue from: delete it to resume from `earlier` (one
    it can), or, with none, start again."""
    return (f"delete that folder to resume from {earlier.name}" if earlier else
            f"start the run again with {option('overwrite')}")


# ---------------------------------------------------------------------------------- a checkpoint against the model
def checkpoint_misfit(checkpoint: Path, model) -> str | None:
    """What keeps `model` from continuing from `checkpoint` exactly, read from the checkpoint's config.json and the
    header of its weights (nothing is loaded): a config field of another value (another preset or size), a tensor
    missing, one the model does not have, or one of another shape; None when it fits. A tensor the model shares
    under several names (tied embeddings) is saved under one."""
    saved_config = read_json(checkpoint / "config.json", damaged_as_none=True)
    if isinstance(saved_config, dict):
        fields = [name for name in model.config.__class__.__annotations__ if not name.startswith("_")]
        current = model.config.to_dict()
        if changed := [name for name in fields if name in saved_config and saved_config[name] != current.get(name)]:
            name = "preset" if "preset" in changed else changed[0]  # the preset, where it differs, says most
            return f"its config.json has {name} {saved_config[name]!r}, the run's model {current.get(name)!r}"
    saved = weight_shapes(checkpoint / FINAL_MODEL)
    names_of: dict[int, list[str]] = {}
    shapes = {}
    for name, tensor in model.state_dict().items():
        names_of.setdefault(tensor.data_ptr(), []).append(name)
        shapes[name] = list(tensor.shape)
    if missing := [names[0] for names in names_of.values() if not any(name in saved for name in names)]:
        return f"{FINAL_MODEL} lacks {missing[0]}" + (f" and {len(missing) - 1} more tensor(s)" if missing[1:] else "")
    if extra := sorted(set(saved) - set(shapes)):
        return f"{FINAL_MODEL} holds {extra[0]}, which the run's model does not have" + \
            (f" (and {len(extra) - 1} more)" if extra[1:] else "")
    for name, shape in saved.items():
        if shape != shapes[name]:
            return f"{FINAL_MODEL} has {name} of shape {shape}, the run's model {shapes[name]}"
    return None


def check_checkpoint_fits(checkpoints: list[Path], model) -> None:
    """The checkpoint --resume continues from (the last) fits the run's model (`checkpoint_misfit`); else one line
    naming what differs and the way on, before anything is written."""
    misfit = checkpoint_misfit(checkpoints[-1], model)
    if misfit is None:
        return
    earlier = next((c for c in reversed(checkpoints[:-1])
                    if checkpoint_damage(c) is None and checkpoint_misfit(c, model) is None), None)
    raise UsageError(f"{option('resume')}: {checkpoints[-1]} does not fit the run's model ({misfit}: a checkpoint "
                     f"of another model, or a damaged one); {way_on(earlier)}")


# ---------------------------------------------------------------------------------- what a callback saved
def saved_callback_state(checkpoint: Path, callback: str) -> dict:
    """What the `TrainerCallback` of class `callback` saved in `checkpoint`'s trainer state ({"args": ...,
    "attributes": ...}; the last, where several of that class did), or {} where none did (a checkpoint written
    before it was recorded) or the trainer state is damaged."""
    state = read_json(Path(checkpoint) / TRAINER_STATE, damaged_as_none=True)
    try:
        saved = state["stateful_callbacks"][callback]
        saved = saved[-1] if isinstance(saved, list) else saved
    except (KeyError, TypeError, IndexError):
        return {}
    return saved if isinstance(saved, dict) else {}
