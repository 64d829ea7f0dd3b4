"""`torch.export` and ONNX export of a saved model, with dynamic batch and sequence axes (Linformer: dynamic batch,
its one fixed length)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram

from convattn.errors import UsageError, option
from convattn.files import atomic_path, special_file


def takes_token_types(model: nn.Module) -> bool:
    """A question-answering or classification model with segment embeddings was fine-tuned on question/context and
    sentence pairs with their token type ids (SQuAD's answer mask is the second segment): its graph takes them."""
    from convattn import ConvAttnForQuestionAnswering, ConvAttnForSequenceClassification, ConvAttnForTokenClassification

    tasks = (ConvAttnForQuestionAnswering, ConvAttnForSequenceClassification, ConvAttnForTokenClassification)
    return isinstance(model, tasks) and model.config.type_vocab_size > 1


def input_names(model: nn.Module) -> list[str]:
    return ["input_ids", "attention_mask"] + (["token_type_ids"] if takes_token_types(model) else [])


def output_names(model: nn.Module) -> list[str]:
    """The head's logits: a question-answering model's start and end logits (the joint head's end logits are those
    of its most likely start, and its answerable logit, "no answer", follows), any other head's one tensor."""
    from convattn import ConvAttnForQuestionAnswering

    if not isinstance(model, ConvAttnForQuestionAnswering):
        return ["logits"]
    return ["start_logits", "end_logits"] + (["answerable_logits"] if model.config.qa_head == "joint" else [])


class LogitsOnly(nn.Module):
    """(input_ids, attention_mask[, token_type_ids]) -> the head's logits (`output_names`), so the graph has plain
    tensor in/outputs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.outputs = output_names(model)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None):
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        if self.outputs == ["logits"]:
            return self.model(**inputs, return_dict=False)[0]
        # the joint head's beam is a branch on the length (min(beam, n)) that a graph cannot keep symbolic
        out = self.model(**inputs, beam=0, return_dict=True)
        return tuple(getattr(out, name) for name in self.outputs)


def load_saved(model_dir: str | os.PathLike, attn_implementation: str | None = None, **config_overrides) -> nn.Module:
    """The saved model with the head it was saved with (config.json's `architectures`), in eval mode."""
    import convattn
    from convattn.checkpoint import load_checked
    from convattn.config import ConvAttnConfig

    config = ConvAttnConfig.from_pretrained(model_dir, **config_overrides)
    architecture = (config.architectures or ["ConvAttnModel"])[0]
    if not architecture.startswith("ConvAttn") or not hasattr(convattn, architecture):
        raise ValueError(f"{model_dir} holds a {architecture}, not a convattn model")
    return load_checked(getattr(convattn, architecture), str(model_dir), allow_new_head=False, config=config,
                        attn_implementation=attn_implementation).eval()


def fixed_length(config) -> int | None:
    """The one length a model takes, or None: Linformer's E/F are sized to max_position_embeddings, and its
    projections slice and pad to it, a branch on the length that an exported graph cannot keep symbolic."""
    return config.max_position_embeddings if any(p != "none" for p in config.layer_projections) else None


def example_inputs(model: nn.Module, batch: int = 2) -> tuple[Tensor, ...]:
    config = model.config
    n = fixed_length(config) or 16
    ids = torch.randint(5, config.vocab_size, (batch, n))
    keep = torch.ones_like(ids)
    keep[-1, n // 2:] = 0
    if not takes_token_types(model):
        return ids, keep
    types = torch.zeros_like(ids)
    types[:, n // 4:] = 1  # a question, then its context
    return ids, keep, types


def dynamic_shapes(model: nn.Module) -> tuple[dict, ...]:
    # sizes 0 and 1 are specialised by torch.export, so the symbolic ranges start at 2
    axes = {0: Dim("batch", min=1, max=4096)}
    if fixed_length(model.config) is None:
        axes[1] = Dim("sequence", min=2, max=model.config.max_input_length or 1 << 20)
    return (axes,) * len(input_names(model))


def export_program(model: nn.Module) -> ExportedProgram:
    """The model (in eval mode) as an ExportedProgram taking (input_ids, attention_mask[, token_type_ids]:
    `input_names`) of any batch and length (a Linformer model: any batch, its `fixed_length`; inputs padded to it)
    and giving `output_names`."""
    return torch.export.export(LogitsOnly(model.eval()), example_inputs(model), dynamic_shapes=dynamic_shapes(model))


def supported_opsets() -> range:
    """The ONNX opsets the installed exporter writes: torch's exporter builds opset 18 and converts the graph with
    onnxscript's version converter, whose range this is."""
    import onnx

    try:
        from onnxscript.version_converter import _version_converter as converter

        low, high = converter.SUPPORTED_MIN_ONNX_OPSET, converter.SUPPORTED_MAX_ONNX_OPSET
    except (ImportError, AttributeError):  # a private module: without it, trust onnx's range and check the result
        low, high = 18, onnx.defs.onnx_opset_version()
    return range(low, min(high, onnx.defs.onnx_opset_version()) + 1)


def check_opset(opset: int) -> None:
    opsets = supported_opsets()
    if opset not in opsets:
        raise UsageError(f"{option('opset')} {opset} is not one the installed ONNX exporter writes: give "
                         f"{opsets.start} to "
                         f"{opsets.stop - 1}")


def check_onnx_path(path: str | os.PathLike) -> None:
    """The output is a file name whose folder exists or can be made, and no file but an ONNX graph is replaced:
    not a device, pipe or socket (`/dev/null`); a symbolic link is replaced itself, not what it points to."""
    path = Path(path)
    if kind := special_file(path):
        raise UsageError(f"{option('onnx')} {path} is {kind}, not a file, which the export would replace; give a "
                         "file name ending in .onnx")
    if path.is_dir():
        raise UsageError(f"{option('onnx')} {path} is a folder; give the file to write, e.g. {path / 'model.onnx'}")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise UsageError(f"{option('onnx')} {path}: {blocking} is a file, so the folder cannot be made")
    from convattn.runs.folder import check_can_make

    check_can_make(path.parent, option("onnx"), path)
    if path.is_file() and path.suffix != ".onnx":  # the model's own weights, a user's file
        raise UsageError(f"{option('onnx')} {path} is an existing file that is not an ONNX graph, which the export "
                         "would replace; give a new file name ending in .onnx")


def export_onnx(model: nn.Module, path: str | os.PathLike, opset: int = 18) -> None:
    """Write an ONNX graph (inputs `input_names`, outputs `output_names`) via the torch.export path. The file
    appears complete or not at all (a temporary file beside it, removed on any failure).

    Give it a model built with attn_implementation="eager": the ONNX decompositions re-trace SDPA with other
    output strides than torch.export recorded, and the graph's reshape of it then fails."""
    if (model.config._attn_implementation or "sdpa") != "eager":
        raise ValueError("export_onnx needs attn_implementation='eager' (see its docstring); "
                         "load the model with load_saved(model_dir, attn_implementation='eager')")
    check_opset(opset)
    check_onnx_path(path)
    program = export_program(model)
    onnx_program = torch.onnx.export(program, example_inputs(model), dynamo=True, opset_version=opset,
                                     input_names=input_names(model), output_names=output_names(model),
                                     verbose=False)
    written = onnx_program.model.opset_imports.get("", opset)
    if written != opset:
        raise UsageError(f"{option('opset')} {opset}: the exporter could not convert the graph to it (it stays at "
                         f"opset {written}); give {option('opset')} {written}")
    try:
        with atomic_path(path, suffix=".onnx.tmp") as tmp:
            onnx_program.save(tmp)
    except OSError as err:
        raise UsageError(f"could not write {path}: {err.strerror or err}") from None
