"""Training memory of a comparison's runs: optimizer state plus the activations of one micro-batch, counted
exactly from what autograd saves for backward, written to runs/<run>/memory.json with the CUDA peaks of the seeds
trained on a GPU."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection

import torch

from convattn.console import say
from convattn.files import read_json, write_json_atomic
from convattn.training.compare.grids import RunSpec
from convattn.training.compare.options import MEMORY_FILE, CompareOptions, run_recipe
from convattn.training.pretrain import build_model, model_config, per_device_batch, sequence_length
from convattn.training.recipes import Recipe


def saved_activation_bytes(fn: Callable[[], object], exclude_storages: Collection[int] = ()) -> int:
    """Bytes of the tensors autograd keeps for backward while running `fn`, once per storage, leaving
    out storages whose data_ptr is in `exclude_storages` (e.g. the parameters').

    Exact and repeatable on every device, where CPU allocator peaks are not observable without a fresh
    process. The graph is only measured, never run backward. The saved tensors are held here, outside
    the graph, until `fn` returns (so no storage is freed and its address reused); packing them into the
    graph instead can tie saved outputs to their own grad_fn in a reference cycle."""
    held: dict[int, torch.Tensor] = {}

    def pack(tensor: torch.Tensor) -> None:
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in exclude_storages:
            held[pointer] = tensor

    def unpack(_) -> torch.Tensor:
        raise RuntimeError("saved_activation_bytes builds a graph for measurement only; it cannot run backward")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        fn()
    total = sum(tensor.untyped_storage().nbytes() for tensor in held.values())
    held.clear()
    return total


def training_memory(recipe: Recipe, tokenizer) -> dict:
    """Training memory of one model, measured the same way on any device (so models compare):

    * state: fp32 weights, gradients and the two AdamW moments, 16 bytes per parameter;
    * activations: the bytes of the tensors autograd saves for backward during the forward pass of one
      training micro-batch (per-device batch x seq_len, random tokens, 15% masked), counted once per storage
      and without the parameters, captured with saved-tensor hooks.

    Allocator overhead and short-lived buffers are left out: a lower bound that ranks models.
    """
    model = build_model(recipe, model_config(recipe), tokenizer).train()
    config = model.config
    seq_len = sequence_length(recipe, config)
    batch = per_device_batch(recipe)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(config.vocab_size, (batch, seq_len), generator=generator)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
              "token_type_ids": torch.zeros_like(input_ids)}
    if recipe.objective == "mlm":
        masked = torch.rand(input_ids.shape, generator=generator) < recipe.mlm_probability
        inputs["labels"] = input_ids.masked_fill(~masked, -100)
    parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    activations = saved_activation_bytes(lambda: model(**inputs), exclude_storages=parameter_storages)
    parameters = model.num_parameters()
    state = 16 * parameters
    return {"parameters": parameters, "encoder_parameters": model.convattn.num_parameters(),
            "micro_batch": [batch, seq_len], "state_bytes": state, "activation_bytes": activations,
            "total_bytes": state + activations}


def memory_recipe_key(recipe: Recipe) -> dict:
    """What the memory measurement depends on (everything but the seed)."""
    return {k: v for k, v in dataclasses.asdict(recipe).items() if k != "seed"}


def update_memory(options: CompareOptions, spec: RunSpec, tokenizer, cuda_peaks: dict[int, int]) -> None:
    """Write runs/<run>/memory.json: the estimate (once per recipe) and CUDA peaks of seeds trained here."""
    path = options.run_path(spec) / MEMORY_FILE
    recipe = run_recipe(options, spec, 0)
    record = read_json(path) or {}
    if record.get("recipe") != json.loads(json.dumps(memory_recipe_key(recipe))):
        say("compare", f"{spec.name}: measuring training memory")
        record = {"recipe": memory_recipe_key(recipe), "estimate": training_memory(recipe, tokenizer),
                  "cuda_peak_bytes": {}}
    record["cuda_peak_bytes"].update({str(seed): peak for seed, peak in cuda_peaks.items()})
    write_json_atomic(path, record)
