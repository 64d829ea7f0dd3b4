"""torch.export and ONNX export match eager outputs, with padding, at lengths other than the traced one."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers.tiny import randomize_, tiny_config

from convattn import ConvAttnForMaskedLM, ConvAttnForSequenceClassification
from convattn.cli import main
from convattn.export import export_program

CASES = [("chang2021-small/composite+conv-qkv", ConvAttnForMaskedLM),
         ("chang2021-small/composite+key", ConvAttnForSequenceClassification),
         ("chang2021-small/convbert", ConvAttnForMaskedLM)]


def tiny(preset, cls=ConvAttnForMaskedLM):
    torch.manual_seed(0)
    model = cls(tiny_config(preset, max_position_embeddings=128))
    randomize_(model)
    return model.eval()


def padded_batch(n: int, batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, 101, (batch, n), generator=torch.Generator().manual_seed(n))
    keep = torch.ones_like(ids)
    keep[1, n // 2:] = 0
    keep[2, n - 3:] = 0
    return ids, keep


@pytest.mark.parametrize(("preset", "cls"), CASES)
@pytest.mark.slow
def test_exported_program_matches_eager_at_two_lengths_with_padding(preset, cls):
    model = tiny(preset, cls)
    exported = export_program(model).module()
    for n, batch in ((37, 3), (128, 5)):
        ids, keep = padded_batch(n, batch)
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=keep).logits
            torch.testing.assert_close(exported(ids, keep), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_exported_relative_model_runs_past_its_trained_length():
    model = tiny("chang2021-small/composite+key")
    ids, keep = padded_batch(300)
    with torch.no_grad():
        torch.testing.assert_close(export_program(model).module()(ids, keep),
                                   model(input_ids=ids, attention_mask=keep).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", ["malard/linformer-n128-k32", "malard/conv-linformer-n128-k32"])
@pytest.mark.slow
def test_linformer_exports_at_its_fixed_length_for_any_batch(preset):
    model = tiny(preset)
    exported = export_program(model).module()
    for batch in (3, 5):
        ids, keep = padded_batch(128, batch)
        with torch.no_grad():
            torch.testing.assert_close(exported(ids, keep), model(input_ids=ids, attention_mask=keep).logits,
                                       rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match="128"):  # another length breaks the graph's guard on the sequence axis
        exported(*padded_batch(64))


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="needs the [onnx] extra (onnxruntime)")
def test_onnx_export_command_matches_eager(tmp_path, capfd):
    import onnx
    import onnxruntime

    model = tiny("chang2021-small/composite+conv-qkv")
    model.save_pretrained(tmp_path / "model")
    capfd.readouterr()
    assert main(["export", str(tmp_path / "model"), "--onnx", str(tmp_path / "model.onnx")]) == 0
    printed = capfd.readouterr()  # the command's own line only, not the exporter's progress and notes
    assert (printed.out, printed.err) == (f"wrote {tmp_path / 'model.onnx'}\n", "")
    graph = onnx.load(tmp_path / "model.onnx")
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask"]
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    for n in (37, 128):
        ids, keep = padded_batch(n)
        (got,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": keep.numpy()})
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=keep).logits
        torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-4, atol=1e-4)
