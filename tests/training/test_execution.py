"""How a training run executes: precision and torch.compile's mode, as the command line gives them and run records
hold them."""

from __future__ import annotations

import os
from pathlib import Path

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
    run_precision,
    settle_launcher,
    stays_on_cpu,
)

FSDP2_YAML = Path(__file__).resolve().parents[2] / "examples" / "fsdp2.yaml"

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


def on_a_machine(monkeypatch, gpu: bool, bf16: bool = True) -> None:
    """torch says this machine has a GPU (with bf16 or not) or none, whatever it has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: gpu and bf16)


@pytest.mark.parametrize(("bf16", "auto"), [(True, "bf16"), (False, "fp16")])
def test_auto_precision_on_a_gpu_is_bf16_where_it_has_it_else_fp16_and_the_run_leaves_the_cpu(monkeypatch, bf16,
                                                                                                auto):
    """What auto computes in on a GPU, and that neither bf16 nor several processes keep a GPU machine's run on the
    CPU (use_cpu there would train on the CPU beside an idle GPU)."""
    on_a_machine(monkeypatch, gpu=True, bf16=bf16)
    assert resolved_precision("auto") == auto and resolved_precision("fp16") == "fp16"
    assert precision_flags("fp16") == {"bf16": False, "fp16": True}
    assert not stays_on_cpu(bf16=True, processes=4) and not stays_on_cpu(bf16=False, processes=2)


def test_the_precision_a_run_records_is_the_one_its_flags_compute_in(monkeypatch):
    """run_precision names what the Trainer's flags run: an fp16 run recorded as anything else would put its
    numbers beside another precision's."""
    on_a_machine(monkeypatch, gpu=True)
    for precision in ("fp32", "bf16", "fp16"):
        assert run_precision(precision_flags(precision)) == precision


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


def launched_with(monkeypatch, *launch: str) -> dict[str, str]:
    """The environment `accelerate launch LAUNCH -m convattn pretrain` gives the processes it starts, set here (no
    process is launched)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args([*launch, "-m", "convattn", "pretrain"])
    environment = prepare_multi_gpu_env(_validate_launch_command(args)[0])
    for name, value in environment.items():
        if name.startswith(("FSDP_", "ACCELERATE_")):
            monkeypatch.setenv(name, value)
    return environment


def what_the_trainer_runs(flags: dict) -> tuple[str, bool, bool]:
    """(the distributed type, whether it autocasts, whether FSDP is on) of the Accelerator a Trainer builds from
    these TrainingArguments and the environment."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir="unused", report_to="none", use_cpu=True, **flags)
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    ran = (str(accelerator.distributed_type), accelerator.native_amp, os.environ.get("ACCELERATE_USE_FSDP") == "true")
    AcceleratorState._reset_state(reset_partial_state=True)
    return ran


@needs_cpu_only
def test_the_fsdp2_recipe_without_gpus_says_it_runs_plain_data_parallel_in_fp32_and_does(monkeypatch):
    """examples/fsdp2.yaml (FSDP2, bf16) on a machine without GPUs: the Trainer cannot shard, and computed in the
    launcher's bf16 (CPU autocast) while the run recorded fp32 (issue 66). Both launcher settings are named in one
    line, and what runs is what the line says."""
    environment = launched_with(monkeypatch, "--config_file", str(FSDP2_YAML))
    assert environment["ACCELERATE_USE_FSDP"] == "true" and environment["ACCELERATE_MIXED_PRECISION"] == "bf16"
    flags = precision_flags("auto")
    assert what_the_trainer_runs(flags)[1]  # unsettled: bf16 autocast behind a record saying fp32
    note = settle_launcher(flags, processes=8)
    assert note == ("accelerate's FSDP (fsdp_version 2, 13 more FSDP_* settings) and mixed_precision bf16 do not "
                    "apply without GPUs: this run is plain data parallelism over 8 processes in fp32 (--precision "
                    "bf16 computes in bf16 on CPU)")
    assert what_the_trainer_runs(flags) == ("DistributedType.NO", False, False)
    assert settle_launcher(flags, processes=8) is None  # said once: the environment now says what runs


@needs_cpu_only
def test_bf16_asked_of_convattn_keeps_the_launchers_bf16_and_drops_only_fsdp(monkeypatch):
    launched_with(monkeypatch, "--config_file", str(FSDP2_YAML))
    flags = precision_flags("bf16")
    assert settle_launcher(flags, processes=2) == (
        "accelerate's FSDP (fsdp_version 2, 13 more FSDP_* settings) does not apply without GPUs: this run is plain "
        "data parallelism over 2 processes in bf16")
    assert what_the_trainer_runs(flags) == ("DistributedType.NO", True, False)


def without_a_launcher(monkeypatch) -> None:
    for name in [n for n in os.environ if n.startswith(("ACCELERATE_", "FSDP_"))]:
        monkeypatch.delenv(name)


def test_a_launchers_other_precision_is_named_and_a_run_without_a_launcher_hears_nothing(monkeypatch):
    without_a_launcher(monkeypatch)
    assert settle_launcher({"bf16": False, "fp16": False}) is None
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert settle_launcher({"bf16": False, "fp16": False}) == (
        "accelerate's mixed_precision bf16 is not used: this run computes in fp32, as --precision says (give "
        "--precision bf16 for the launcher's)")
    assert os.environ["ACCELERATE_MIXED_PRECISION"] == "no"


def test_pretraining_says_what_the_launcher_asked_that_it_does_not_do(monkeypatch, tmp_path, capsys):
    from convattn.training.pretrain.resolve import resolve_options
    from convattn.training.pretrain.trainer import pretraining_arguments

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    options = resolve_options(output_dir=tmp_path, preset="chang2021-small/composite", training={"max_steps": 10},
                              precision="fp32")
    args = pretraining_arguments(options)
    assert args.mixed_precision == "no" and not args.bf16 and not args.fp16
    assert "convattn pretrain: warning: accelerate's mixed_precision fp16 is not used: this run computes in fp32" \
        in capsys.readouterr().err


@pytest.mark.parametrize(("launcher", "precision", "said", "set_to"), [
    # set to the run's precision, not merely to "no" or left: the Trainer computes in what it says
    ("fp16", "bf16", "accelerate's mixed_precision fp16 is not used: this run computes in bf16, as --precision says "
                     "(give --precision fp16 for the launcher's)", "bf16"),
    ("no", "bf16", None, "bf16"),  # accelerate's default, not a precision asked for: nothing said
    # fp8 is accelerate's, not --precision's: the line offers no --precision fp8
    ("fp8", "fp32", "accelerate's mixed_precision fp8 is not used: this run computes in fp32, as --precision says",
     "no"),
])
def test_a_launchers_mixed_precision_is_set_to_the_runs_and_named_where_it_was_asked(monkeypatch, launcher,
                                                                                     precision, said, set_to):
    without_a_launcher(monkeypatch)
    on_a_machine(monkeypatch, gpu=False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launcher)
    assert settle_launcher(precision_flags(precision)) == said
    assert os.environ["ACCELERATE_MIXED_PRECISION"] == set_to


def test_fsdp_on_a_gpu_is_left_to_the_launcher(monkeypatch):
    """With a GPU, FSDP applies: settling keeps it (and the launcher's matching bf16) and says nothing."""
    without_a_launcher(monkeypatch)
    on_a_machine(monkeypatch, gpu=True)
    launcher = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "ACCELERATE_MIXED_PRECISION": "bf16"}
    for name, value in launcher.items():
        monkeypatch.setenv(name, value)
    assert settle_launcher(precision_flags("bf16"), processes=2) is None
    assert os.environ["ACCELERATE_USE_FSDP"] == "true" and os.environ["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_fsdp_asked_as_true_in_any_case_is_dropped_without_a_gpu(monkeypatch):
    """The Accelerator reads ACCELERATE_USE_FSDP case-blind ("True" turns FSDP on), so settling does too."""
    without_a_launcher(monkeypatch)
    on_a_machine(monkeypatch, gpu=False)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "True")
    assert settle_launcher(precision_flags("fp32")) == (
        "accelerate's FSDP does not apply without GPUs: this run is one process in fp32 (--precision bf16 computes "
        "in bf16 on CPU)")
    assert "ACCELERATE_USE_FSDP" not in os.environ


def test_compiling_on_a_gpu_leaves_inductors_random_operators_its_own(monkeypatch):
    """fallback_random is the CPU's: set on a GPU it would move dropout off inductor's generator there (and slow it),
    unlike what compile_difference records for a GPU run."""
    import torch._inductor.config

    on_a_machine(monkeypatch, gpu=True)
    with torch._inductor.config.patch(fallback_random=False):
        assert compile_arguments("default") == {"torch_compile": True, "torch_compile_mode": None}
        assert not torch._inductor.config.fallback_random
