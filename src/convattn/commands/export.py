"""`convattn export`: a saved model as an ONNX graph with dynamic batch and sequence axes (Linformer: its one
length)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from convattn.commands.arguments import user_path

NAME = "export"
HELP = "export a saved model to ONNX (dynamic batch and sequence axes; Linformer at its fixed length)"
DESCRIPTION = (
    "Export a saved model (any head) to ONNX through torch.export: inputs input_ids and attention_mask (and "
    "token_type_ids for a fine-tuned head), output the head's logits (question answering: start_logits, end_logits "
    "and the joint head's answerable_logits). Needs the [onnx] extra (onnx, onnxscript)."
)
DEFAULT_OPSET = 18


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", type=user_path, help="a folder written by save_pretrained / convattn pretrain")
    parser.add_argument("--onnx", type=user_path, required=True, metavar="OUT.onnx", help="the ONNX file to write")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET,
                        help="ONNX opset version: one the installed exporter writes (checked first; 18 to 25 with "
                             "current onnxscript)")
    parser.set_defaults(func=run)


@contextlib.contextmanager
def exporter_quiet() -> Iterator[None]:
    """The command's own lines only: not the exporter's notes on operators it skips (torchvision's, when torchvision
    is not installed) nor the deprecation warnings of the libraries it calls. Errors still show."""
    import logging
    import warnings

    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        logger.setLevel(level)


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from convattn.errors import UsageError

    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"ONNX export needs {' and '.join(missing)}: pip install onnx onnxscript onnxruntime "
                         "(from a clone of convattn: pip install -e '.[onnx]')")
    from convattn.checkpoint import check_model_folder
    from convattn.export import check_onnx_path, check_opset, export_onnx, load_saved
    from convattn.runs.folder import run_folder_lock

    check_opset(args.opset)
    check_onnx_path(args.onnx)
    if not args.model_dir.is_dir():
        raise UsageError(f"{args.model_dir} is not a folder: give the folder of a saved model")
    check_model_folder(args.model_dir, flag="model_dir", need_convattn="convattn export writes convattn models only")
    model = load_saved(args.model_dir, attn_implementation="eager")
    # the folder written into is this process's while the graph is written (the lock every writing command takes):
    # not a run folder another convattn process is writing, and no other export of the same file
    with run_folder_lock(args.onnx.parent, "--onnx"), exporter_quiet():
        export_onnx(model, args.onnx, opset=args.opset)  # checks --onnx again, under the lock
    print(f"wrote {args.onnx}")
    return 0
