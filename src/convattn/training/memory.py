"""Activation memory of a training step, counted exactly from what autograd saves for backward."""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch


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
