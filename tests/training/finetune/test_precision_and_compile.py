"""Fine-tuning's precision and torch.compile: what a seed records and reuses, the padding a compiled run batches
with, and a compiled GLUE run computing what the eager one does."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from helpers.tiny import save_tiny_checkpoint, tiny_wordpiece_tokenizer
from transformers import DataCollatorWithPadding

from convattn.cli import main
from convattn.training.execution import COMPILED_PAD_MULTIPLE
from convattn.training.finetune import trainer as finetune_trainer
from convattn.training.finetune.settings import FineTuneSettings, resolved_settings, same_settings

FIXTURE_GLUE_DATA = Path(__file__).resolve().parents[2] / "fixtures" / "glue_data"
SENTENCES = ["a dog runs in the park .", "the cat sat on the mat .", "nothing moves at all ."] * 50
needs_cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what auto means without a GPU")

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def settings(**fields) -> FineTuneSettings:
    base = dict(learning_rate=1e-4, batch_size=8, epochs=1.0, warmup_ratio=0.1, weight_decay=0.0, layer_decay=1.0,
                adam_epsilon=1e-6, max_length=128)
    return FineTuneSettings(**(base | fields))


@needs_cpu_only
def test_auto_precision_is_recorded_as_what_ran():
    assert resolved_settings(settings()).precision == "fp32"
    assert resolved_settings(settings(precision="bf16")).precision == "bf16"


def test_a_seed_recorded_before_precision_was_reuses_as_fp32_and_compile_never_matters():
    recorded = {k: v for k, v in dataclasses.asdict(settings()).items() if k not in ("precision", "compile")}
    assert same_settings(recorded, settings(precision="fp32"))
    assert same_settings(recorded, settings(precision="fp32", compile="reduce-overhead"))
    assert not same_settings(recorded, settings(precision="bf16"))
    assert not same_settings({**recorded, "learning_rate": 2e-4}, settings(precision="fp32"))


@needs_cpu_only
def test_the_trainer_gets_the_precision_and_the_compile_mode(tmp_path):
    args = finetune_trainer.fine_tuning_arguments(tmp_path, settings(precision="bf16", compile="reduce-overhead"), 0,
                                                  "glue")
    assert args.bf16 and not args.fp16 and args.use_cpu  # CPU autocast needs use_cpu
    assert args.torch_compile and args.torch_compile_mode == "reduce-overhead"
    eager = finetune_trainer.fine_tuning_arguments(tmp_path, settings(precision="fp32"), 0, "glue")
    assert not eager.bf16 and not eager.torch_compile


@pytest.mark.parametrize(("lengths", "max_length", "width"), [
    ([5, 9], 128, COMPILED_PAD_MULTIPLE), ([5, 70], 128, 128), ([5, 70], 100, 100), ([3], 16, 16),
])
def test_compiled_batches_pad_to_a_few_widths(lengths, max_length, width):
    tokenizer = tiny_wordpiece_tokenizer(SENTENCES)
    features = [{"input_ids": [5] * n, "attention_mask": [1] * n} for n in lengths]
    compiled = finetune_trainer.padding_collator(DataCollatorWithPadding, tokenizer,
                                                 settings(max_length=max_length, compile="default"))
    batch = compiled([dict(f) for f in features])
    assert batch["input_ids"].shape == (len(lengths), width)
    assert batch["attention_mask"].sum(1).tolist() == lengths
    eager = finetune_trainer.padding_collator(DataCollatorWithPadding, tokenizer, settings(max_length=max_length))
    assert eager([dict(f) for f in features])["input_ids"].shape == (len(lengths), max(lengths))


def test_squads_answer_mask_pads_to_the_compiled_width():
    from convattn.training.squad.run import SquadCollator

    tokenizer = tiny_wordpiece_tokenizer(SENTENCES)
    features = [{"input_ids": [5] * n, "attention_mask": [1] * n, "answer_mask": [1] * n} for n in (5, 9)]
    batch = finetune_trainer.padding_collator(SquadCollator, tokenizer, settings(compile="reduce-overhead"))(features)
    assert batch["input_ids"].shape == batch["answer_mask"].shape == (2, COMPILED_PAD_MULTIPLE)
    assert batch["answer_mask"].sum(1).tolist() == [5, 9]


def test_a_compiled_glue_run_computes_what_the_eager_one_does(tmp_path, monkeypatch):
    """`convattn glue --compile-mode reduce-overhead` through the Trainer's torch.compile (with aot_eager: the
    graph dynamo captures and AOTAutograd splits, without inductor's minutes of C++ compilation on this CPU):
    the same training loss and dev scores as eager (without dropout, whose masks follow the padded width), the
    model saved without torch.compile's wrapper."""
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny", SENTENCES)
    config = json.loads((checkpoint / "config.json").read_text())  # no dropout: its masks follow the padded width
    (checkpoint / "config.json").write_text(json.dumps(config | {"hidden_dropout_prob": 0.0,
                                                                  "attention_probs_dropout_prob": 0.0}))
    modes = []

    def aot_eager(mode, command=None):
        modes.append(mode)
        return {"torch_compile": mode is not None, "torch_compile_backend": "aot_eager"} if mode else {}

    monkeypatch.setattr(finetune_trainer, "compile_arguments", aot_eager)
    runs = {}
    for name, flags in (("eager", []), ("compiled", ["--compile-mode", "reduce-overhead"])):
        out = tmp_path / name
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        assert main(["glue", "--model", str(checkpoint), "--task", "sst2", "--data-dir", str(FIXTURE_GLUE_DATA),
                     "--seeds", "1", "--max-steps", "3", "--batch-size", "8", "--max-train-samples", "48",
                     "--output-dir", str(out), *flags]) == 0
        runs[name] = json.loads((out / "runs" / "sst2" / "seed0" / "run.json").read_text())
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        assert (graphs > 0) == (name == "compiled")
    torch._dynamo.reset()
    assert modes == [None, "reduce-overhead"]
    eager, compiled = runs["eager"], runs["compiled"]
    assert compiled["settings"]["compile"] == "reduce-overhead" and compiled["settings"]["precision"] == "fp32"
    assert compiled["train"]["loss"] == pytest.approx(eager["train"]["loss"], rel=1e-4)
    assert compiled["metrics"] == eager["metrics"]
    from safetensors import safe_open

    with safe_open(tmp_path / "compiled" / "models" / "sst2" / "model.safetensors", "pt") as weights:
        names = list(weights.keys())
    assert names and not any("_orig_mod" in name for name in names)


@needs_cpu_only
def test_a_glue_run_in_bf16_says_so_and_is_not_mixed_with_fp32_seeds(tmp_path, capsys):
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny", SENTENCES)
    out = tmp_path / "out"
    argv = ["glue", "--model", str(checkpoint), "--task", "sst2", "--data-dir", str(FIXTURE_GLUE_DATA), "--seeds", "1",
            "--max-steps", "2", "--batch-size", "8", "--max-train-samples", "16", "--output-dir", str(out)]
    assert main([*argv, "--precision", "bf16"]) == 0
    run = json.loads((out / "runs" / "sst2" / "seed0" / "run.json").read_text())
    assert run["settings"]["precision"] == "bf16" and run["settings"]["compile"] is None
    assert "| 16 | bf16 |" in (out / "glue_results.md").read_text()
    capsys.readouterr()
    assert main(argv) == 2  # auto: fp32 on this CPU
    assert "other settings" in capsys.readouterr().err
    assert main([*argv, "--precision", "bf16", "--compile"]) == 0  # the finished seed is reused whatever compile
    assert "all 1 seeds already finished" in capsys.readouterr().err
