"""FSDP2 (PyTorch's `fully_shard`), the engine behind examples/fsdp2.yaml: accelerate reads the file as FSDP2
sharding every encoder layer, and 2 CPU processes (gloo) sharded that way train a convattn model as one process
does on the same global batch, through a sharded checkpoint saved and resumed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.fsdp_worker import GLOBAL_BATCH, PRESET_VARIABLE, global_batch, tiny_model

ROOT = Path(__file__).resolve().parents[3]
FSDP2_YAML = ROOT / "examples" / "fsdp2.yaml"
WORKER = ROOT / "tests" / "helpers" / "fsdp_worker.py"


def test_accelerate_reads_the_committed_config_as_fsdp2_sharding_each_encoder_layer(monkeypatch):
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(FSDP2_YAML), "-m", "convattn", "pretrain"])
    environment = prepare_multi_gpu_env(_validate_launch_command(args)[0])
    for name, value in environment.items():
        if name.startswith(("FSDP_", "ACCELERATE_")):
            monkeypatch.setenv(name, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and environment["ACCELERATE_MIXED_PRECISION"] == "bf16"
    model = tiny_model()
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    assert [module for module in model.modules() if policy(module)] == list(model.convattn.encoder.layer)


def torchrun(out: Path, steps: int, *resume: Path) -> list[float]:
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(WORKER), str(out), str(steps), *map(str, resume)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests")}  # the preset's variable too
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)  # a hang guard only
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "losses.json").read_text())


def one_process_losses(steps: int) -> list[float]:
    model, (ids, labels) = tiny_model(), global_batch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["chang2021-small/composite", "chang2021-small/rotary"])
def test_two_sharded_cpu_processes_train_as_one_and_resume_from_a_sharded_checkpoint(preset, tmp_path, monkeypatch):
    """Rotary too: its projections run in pair order where their weights are plain tensors, not where they are
    sharded."""
    monkeypatch.setenv(PRESET_VARIABLE, preset)
    first = torchrun(tmp_path / "first", 3)
    checkpoint = tmp_path / "first" / "checkpoint"
    assert sorted(p.name for p in checkpoint.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    resumed = torchrun(tmp_path / "resumed", 2, checkpoint)
    reference = one_process_losses(5)
    assert GLOBAL_BATCH % 2 == 0 and reference[-1] < reference[0]  # it learns
    assert first + resumed == pytest.approx(reference, rel=1e-5)
