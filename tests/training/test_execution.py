"""How a training run executes: precision and torch.compile's mode, as the command line gives them and run records
hold them."""

from __future__ import annotations

import pytest
import torch

from convattn.errors import UsageError
from convattn.training.execution import (
    COMPILE_MODES,
    compile_arguments,
    compile_mode,
    precision_flags,
    recorded_compile_mode,
    resolved_precision,
    stays_on_cpu,
)

needs_cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what auto means without a GPU")


@needs_cpu_only
def test_auto_precision_is_fp32_on_cpu_and_bf16_runs_there():
    assert resolved_precision("auto") == "fp32"
    assert precision_flags("bf16") == {"bf16": True, "fp16": False}
    assert precision_flags("fp32") == {"bf16": False, "fp16": False}


@needs_cpu_only
def test_a_cpu_run_is_kept_on_the_cpu_for_bf16_autocast_and_for_several_processes():
    assert stays_on_cpu(bf16=True) and stays_on_cpu(bf16=False, processes=2)
    assert not stays_on_cpu(bf16=False)


@needs_cpu_only
def test_fp16_without_a_gpu_is_refused_naming_the_flag():
    with pytest.raises(UsageError, match="fp16 needs a GPU"):
        resolved_precision("fp16")


def test_an_unknown_precision_names_the_choices():
    with pytest.raises(UsageError, match="'fp8' is not known; choose one of auto, fp32, bf16, fp16"):
        resolved_precision("fp8")


@pytest.mark.parametrize(("compile", "mode", "expected"), [
    (False, None, None), (True, None, "default"), (False, "reduce-overhead", "reduce-overhead"),
    (True, "max-autotune", "max-autotune"),
])
def test_compile_mode_implies_compile(compile, mode, expected):
    assert compile_mode(compile, mode) == expected


def test_an_unknown_compile_mode_names_the_choices():
    with pytest.raises(UsageError, match="'fast' is not known; choose one of default, reduce-overhead, max-autotune"):
        compile_mode(False, "fast")


@pytest.mark.parametrize(("recorded", "mode"), [(True, "default"), (False, None), (None, None),
                                                 ("reduce-overhead", "reduce-overhead")])
def test_records_from_before_compile_modes_read_as_modes(recorded, mode):
    assert recorded_compile_mode(recorded) == mode


@pytest.mark.parametrize("mode", [None, *COMPILE_MODES])
def test_the_trainer_gets_the_mode(mode):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir="unused", report_to="none", **compile_arguments(mode))
    assert args.torch_compile == (mode is not None)
    assert args.torch_compile_mode == (None if mode in (None, "default") else mode)


@pytest.mark.parametrize(("recorded", "mode"), [(True, "default"), (False, None), ("reduce-overhead",
                                                                                    "reduce-overhead")])
def test_a_pretraining_run_recorded_before_modes_resumes_with_its_compile_setting(tmp_path, recorded, mode):
    from convattn.training.pretrain.options import PretrainOptions
    from convattn.training.pretrain.resolve import resolve_options

    saved = resolve_options(output_dir=tmp_path, preset="chang2021-small/composite",
                            training={"max_steps": 10}).to_json()
    assert PretrainOptions.from_json(saved | {"compile": recorded}).compile == mode


def test_the_commands_take_the_mode(tmp_path):
    from convattn.cli import build_parser
    from convattn.commands.arguments import compile_mode_asked

    parser = build_parser()
    for command in (["pretrain"], ["compare", "--grid", "g.yaml"], ["glue", "--model", "m", "--task", "sst2"],
                    ["squad", "--model", "m", "--version", "1.1"]):
        args = parser.parse_args([*command, "--compile-mode", "reduce-overhead", "--precision", "bf16"])
        assert compile_mode_asked(args) == "reduce-overhead" and args.precision == "bf16"
        assert compile_mode_asked(parser.parse_args([*command, "--compile"])) == "default"
        assert compile_mode_asked(parser.parse_args(command)) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="what compiling changes without a GPU")
def test_compiling_on_cpu_draws_dropout_as_eager_and_says_what_still_differs(capsys):
    import torch._inductor.config

    from convattn.training import execution
    from convattn.training.pretrain.options import COMPILE_DIFFERENCE
    from convattn.training.pretrain.resolve import resolve_options

    with torch._inductor.config.patch(fallback_random=False):
        execution._SAID.clear()
        assert compile_arguments("default", "pretrain") == {"torch_compile": True, "torch_compile_mode": None}
        assert torch._inductor.config.fallback_random  # dropout from eager's generator: same seed, same masks
        [line] = capsys.readouterr().err.splitlines()
        assert line == f"convattn pretrain: --compile: {execution.compile_difference('default')}"
        assert "runs padding-free in eager mode and padded when compiled" in line
        for _ in range(2):  # fine-tuning builds its arguments once a seed: each line said once (the first was)
            compile_arguments("reduce-overhead", "glue")
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            "convattn glue: --compile-mode reduce-overhead replays CUDA graphs, and this machine has no GPU: it runs "
            "as default")
    options = resolve_options(preset="chang2021-small/composite", training={"max_steps": 10}, compile="default")
    assert options.to_json()[COMPILE_DIFFERENCE] == execution.compile_difference("default")
    assert COMPILE_DIFFERENCE not in resolve_options(preset="chang2021-small/composite",
                                                     training={"max_steps": 10}).to_json()
