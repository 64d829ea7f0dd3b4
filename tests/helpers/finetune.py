"""Tiny glue and squad commands on the fixtures, for the tests of what fine-tuning jobs do when things go wrong."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GLUE_DATA = FIXTURES / "glue_data"  # SST-2: 48 training examples
SQUAD = FIXTURES / "squad"
SENTENCES = ["a dog runs in the park .", "the cat sat on the mat .", "where does the river elm rise ?",
             "the bridge at harlow has nine arches ."] * 40  # a tiny checkpoint's tokenizer text


def job_argv(job: str, checkpoint: Path, out: Path, *extra: str, train: Path = SQUAD / "train-v1.1.json",
             dev: Path = SQUAD / "dev-v1.1.json") -> list[str]:
    """`convattn glue` on SST-2 or `convattn squad` v1.1 (short windows) with one seed; `extra` sets the rest."""
    if job == "glue":
        return ["glue", "--model", str(checkpoint), "--task", "sst2", "--data-dir", str(GLUE_DATA), "--output-dir",
                str(out), "--seeds", "1", *extra]
    return ["squad", "--model", str(checkpoint), "--version", "1.1", "--train-file", str(train), "--dev-file",
            str(dev), "--output-dir", str(out), "--seeds", "1", "--max-length", "48", "--doc-stride", "16",
            "--max-query-length", "12", *extra]


def rewriting_the_model_after(fine_tune, model: Path):
    """`fine_tune` (a job module's), then the weights of `model` rewritten: a `pretrain --resume` finishing into
    --model while the job's seeds run."""
    from safetensors.torch import load_file, save_file

    def then_rewrite_the_model(*args, **kwargs):
        run = fine_tune(*args, **kwargs)
        weights = load_file(model / "model.safetensors")
        save_file({name: tensor + 1 for name, tensor in weights.items()}, model / "model.safetensors",
                  metadata={"format": "pt"})
        return run
    return then_rewrite_the_model
