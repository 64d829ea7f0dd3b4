"""One process of an FSDP2 run (`torch.distributed.run`, gloo on CPU): a tiny composite-attention masked LM sharded
as examples/fsdp2.yaml shards it under accelerate (each layer the yaml names, then the whole model), trained with
AdamW on this process's share of a fixed global batch.

    python -m torch.distributed.run --nproc-per-node N fsdp_worker.py OUT STEPS [RESUME_FROM]

Rank 0 writes the mean loss of every step to OUT/losses.json; the model and optimizer are saved as a sharded
checkpoint (torch.distributed.checkpoint, one file per process) in OUT/checkpoint, and RESUME_FROM loads one.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

GLOBAL_BATCH, LENGTH = 8, 24


# the preset the test trains (its processes and its one-process reference read it)
PRESET_VARIABLE = "CONVATTN_FSDP_TEST_PRESET"


def tiny_model() -> torch.nn.Module:
    from convattn import ConvAttnForMaskedLM
    from helpers.tiny import tiny_config

    torch.manual_seed(0)  # the same initial weights in every process, and in the one-process reference
    return ConvAttnForMaskedLM(tiny_config(os.environ.get(PRESET_VARIABLE, "chang2021-small/composite")))


def global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and their MLM labels (every token scored, so each process's loss has the same weight)."""
    ids = torch.randint(5, 101, (GLOBAL_BATCH, LENGTH), generator=torch.Generator().manual_seed(1))
    return ids, ids.flip(1)


def shard_units(layer_class_names: list[str], model: torch.nn.Module) -> list[torch.nn.Module]:
    return [module for module in model.modules() if type(module).__name__ in layer_class_names]


def main(out: Path, steps: int, resume_from: Path | None) -> None:
    import yaml

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    fsdp = yaml.safe_load((Path(__file__).parents[2] / "examples" / "fsdp2.yaml").read_text())["fsdp_config"]
    model = tiny_model()
    for unit in shard_units(fsdp["fsdp_transformer_layer_cls_to_wrap"].split(","), model):
        fully_shard(unit, reshard_after_forward=fsdp["fsdp_reshard_after_forward"])
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if resume_from is not None:
        state = dict(zip(("model", "optimizer"), get_state_dict(model, optimizer), strict=True))
        dcp.load(state, checkpoint_id=resume_from)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    ids, labels = global_batch()
    share = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids[share], labels=labels[share]).loss
        loss.backward()  # FSDP averages the gradients over processes: the global batch's mean loss
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=out / "checkpoint")
    if rank == 0:
        (out / "losses.json").write_text(json.dumps(losses))
    # every process past its last collective before any tears gloo down: on 2 loaded cores a process leaving first
    # once aborted the other ("terminate called without an active exception") in the full suite
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, for helpers.tiny
    main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
