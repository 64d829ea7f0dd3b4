"""`torch.export` and ONNX export of a saved model, with dynamic batch and sequence axes."""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram


class LogitsOnly(nn.Module):
    """(input_ids, attention_mask) -> the head's first output, so the graph has plain tensor in/outputs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


def load_saved(model_dir: str | os.PathLike, attn_implementation: str | None = None, **config_overrides) -> nn.Module:
    """The saved model with the head it was saved with (config.json's `architectures`), in eval mode."""
    import convattn
    from convattn.config import ConvAttnConfig

    config = ConvAttnConfig.from_pretrained(model_dir, **config_overrides)
    architecture = (config.architectures or ["ConvAttnModel"])[0]
    if not architecture.startswith("ConvAttn") or not hasattr(convattn, architecture):
        raise ValueError(f"{model_dir} holds a {architecture}, not a convattn model")
    return getattr(convattn, architecture).from_pretrained(model_dir, config=config,
                                                           attn_implementation=attn_implementation).eval()


def example_inputs(config, batch: int = 2, n: int = 16) -> tuple[Tensor, Tensor]:
    ids = torch.randint(5, config.vocab_size, (batch, n))
    keep = torch.ones_like(ids)
    keep[-1, n // 2:] = 0
    return ids, keep


def dynamic_shapes(config) -> dict:
    # sizes 0 and 1 are specialised by torch.export, so the symbolic ranges start at 2
    batch = Dim("batch", min=1, max=4096)
    seq = Dim("sequence", min=2, max=config.max_input_length or 1 << 20)
    return {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}


def export_program(model: nn.Module) -> ExportedProgram:
    """The model (in eval mode) as an ExportedProgram taking (input_ids, attention_mask) of any batch and length."""
    if any(p != "none" for p in model.config.layer_projections):
        raise ValueError(
            "sequence_projection (Linformer) models cannot be exported with a dynamic sequence axis: their "
            "projections slice and pad to max_position_embeddings, a branch on the length"
        )
    wrapped = LogitsOnly(model.eval())
    return torch.export.export(wrapped, example_inputs(model.config), dynamic_shapes=dynamic_shapes(model.config))


def export_onnx(model: nn.Module, path: str | os.PathLike, opset: int = 18) -> None:
    """Write an ONNX graph (inputs input_ids, attention_mask; output logits) via the torch.export path.

    Give it a model built with attn_implementation="eager": the ONNX decompositions re-trace SDPA with other
    output strides than torch.export recorded, and the graph's reshape of it then fails."""
    if model.config.attention_implementation != "eager":
        raise ValueError("export_onnx needs attn_implementation='eager' (see its docstring); "
                         "load the model with load_saved(model_dir, attn_implementation='eager')")
    program = export_program(model)
    onnx_program = torch.onnx.export(program, example_inputs(model.config), dynamo=True, opset_version=opset,
                                     input_names=["input_ids", "attention_mask"], output_names=["logits"])
    tmp = f"{path}.tmp"
    onnx_program.save(tmp)
    os.replace(tmp, path)
