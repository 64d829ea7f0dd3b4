"""torch.export and ONNX export match eager outputs, with padding, at lengths other than the traced one: every head,
question answering included (its start and end logits, the joint head's answerable logit)."""

from __future__ import annotations

import errno
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.tiers import slow_except
from helpers.tiny import randomize_, tiny_config

from convattn import ConvAttnForMaskedLM, ConvAttnForQuestionAnswering, ConvAttnForSequenceClassification
from convattn.cli import main
from convattn.errors import UsageError
from convattn.export import (
    dynamic_shapes,
    export_onnx,
    export_program,
    fixed_length,
    input_names,
    load_saved,
    output_names,
    supported_opsets,
)

CASES = [("chang2021-small/composite+conv-qkv", ConvAttnForMaskedLM),
         ("chang2021-small/composite+key", ConvAttnForSequenceClassification),
         ("chang2021-small/convbert", ConvAttnForMaskedLM),
         ("chang2021-small/composite+rotary", ConvAttnForMaskedLM),
         ("chang2021-small/alibi", ConvAttnForSequenceClassification)]


def tiny(preset, cls=ConvAttnForMaskedLM, **fields):
    torch.manual_seed(0)
    model = cls(tiny_config(preset, max_position_embeddings=128, **fields))
    randomize_(model)
    return model.eval()


def padded_batch(n: int, batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, 101, (batch, n), generator=torch.Generator().manual_seed(n))
    keep = torch.ones_like(ids)
    keep[1, n // 2:] = 0
    keep[2, n - 3:] = 0
    return ids, keep


def segments(ids: torch.Tensor) -> torch.Tensor:
    """Token type ids: a question (a third of the row), then its context."""
    types = torch.zeros_like(ids)
    types[:, ids.shape[1] // 3:] = 1
    return types


@pytest.mark.parametrize(("preset", "cls"), CASES)
@pytest.mark.slow
def test_exported_program_matches_eager_at_two_lengths_with_padding(preset, cls):
    model = tiny(preset, cls)
    exported = export_program(model).module()
    for n, batch in ((37, 3), (128, 5)):
        ids, keep = padded_batch(n, batch)
        types = (segments(ids),) if "token_type_ids" in input_names(model) else ()
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=keep, token_type_ids=(types or (None,))[0]).logits
            torch.testing.assert_close(exported(ids, keep, *types), expected, rtol=1e-5, atol=1e-5)


def test_a_model_exported_with_position_ids_reads_its_batch_as_padded():
    """torch.export cannot branch on the data: position_ids given to it are checked for their shape and dtype only
    and the batch is read as padded, each row one sequence (flattened_sequences); the program matches eager."""
    model = tiny("chang2021-small/absolute")
    ids, keep = padded_batch(37)
    inputs = {"input_ids": ids, "attention_mask": keep, "position_ids": torch.arange(37).expand(3, 37)}
    exported = torch.export.export(model, (), inputs, strict=False).module()
    with torch.no_grad():
        torch.testing.assert_close(exported(**inputs).logits, model(**inputs).logits, rtol=1e-5, atol=1e-5)


def test_a_classifier_takes_the_token_types_it_was_fine_tuned_with():
    # a sentence-pair task's logits depend on the segments; a graph without them scored every pair as one segment
    model = tiny("chang2021-small/composite+key", ConvAttnForSequenceClassification)
    assert input_names(model) == ["input_ids", "attention_mask", "token_type_ids"]
    assert input_names(tiny("chang2021-small/composite+key")) == ["input_ids", "attention_mask"]  # masked LM


@pytest.mark.parametrize("qa_head", ["span", "joint"])
def test_question_answering_exports_with_a_dynamic_length(qa_head):
    # the joint head's beam (min(20, n) starts) made torch.export fail: "Constraints violated (sequence)"
    model = tiny("chang2021-small/composite+conv-qkv", ConvAttnForQuestionAnswering, qa_head=qa_head)
    randomize_(model)
    names = output_names(model)
    assert names == ["start_logits", "end_logits"] + (["answerable_logits"] if qa_head == "joint" else [])
    exported = export_program(model).module()
    for n, batch in ((37, 3), (128, 5), (7, 3)):  # past the traced 16, and below the joint head's beam of 20
        ids, keep = padded_batch(n, batch)
        got = exported(ids, keep, segments(ids))
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=keep, token_type_ids=segments(ids))
        assert len(got) == len(names)
        for value, name in zip(got, names, strict=True):
            torch.testing.assert_close(value, getattr(expected, name), rtol=1e-5, atol=1e-5)


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
@pytest.mark.parametrize("preset", slow_except(["chang2021-small/composite+conv-qkv", "chang2021-small/rotary",
                                                "chang2021-small/alibi"], "chang2021-small/composite+conv-qkv"))
def test_onnx_export_command_matches_eager(preset, tmp_path, capfd):
    import onnx
    import onnxruntime

    model = tiny(preset)
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


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="needs the [onnx] extra (onnxruntime)")
@pytest.mark.slow  # the command's fast case is the masked LM's above
def test_onnx_export_command_writes_a_squad_model(tmp_path):
    import onnxruntime

    model = tiny("chang2021-small/composite+conv-qkv", ConvAttnForQuestionAnswering, qa_head="joint")
    randomize_(model)
    model.save_pretrained(tmp_path / "model")
    assert main(["export", str(tmp_path / "model"), "--onnx", str(tmp_path / "qa.onnx")]) == 0
    session = onnxruntime.InferenceSession(str(tmp_path / "qa.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [o.name for o in session.get_outputs()] == ["start_logits", "end_logits", "answerable_logits"]
    for n in (37, 128):
        ids, keep = padded_batch(n)
        got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": keep.numpy(),
                                 "token_type_ids": segments(ids).numpy()})
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=keep, token_type_ids=segments(ids))
        for value, name in zip(got, ("start_logits", "end_logits", "answerable_logits"), strict=True):
            torch.testing.assert_close(torch.from_numpy(value), getattr(expected, name), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- what the graph takes, and from which folder


def test_a_classifier_with_one_token_type_takes_no_token_types():
    model = tiny("chang2021-small/composite+key", ConvAttnForSequenceClassification, type_vocab_size=1)
    assert input_names(model) == ["input_ids", "attention_mask"]


def test_any_layer_with_a_sequence_projection_fixes_the_length():
    """One Linformer layer among plain ones slices and pads to its length as all-Linformer models do."""
    assert fixed_length(SimpleNamespace(max_position_embeddings=128, layer_projections=["none", "linear"])) == 128
    assert fixed_length(SimpleNamespace(max_position_embeddings=128, layer_projections=["none", "none"])) is None


def test_the_sequence_axis_stops_at_what_absolute_positions_reach():
    """Absolute position embeddings reach max_position_embeddings: the exported length may not pass it; relative
    positions have no such bound."""
    assert dynamic_shapes(tiny("chang2021-small/absolute"))[0][1].max == 128
    assert dynamic_shapes(tiny("chang2021-small/composite"))[0][1].max == 1 << 20


def test_a_batch_of_one_runs_through_the_exported_program():
    model = tiny("chang2021-small/composite+key")
    ids, keep = (x[1:2] for x in padded_batch(9))  # a padded row
    with torch.no_grad():
        torch.testing.assert_close(export_program(model).module()(ids, keep),
                                   model(input_ids=ids, attention_mask=keep).logits, rtol=1e-5, atol=1e-5)


def test_the_opsets_are_the_converters_up_to_what_onnx_knows():
    onnx = pytest.importorskip("onnx")
    converter = pytest.importorskip("onnxscript.version_converter._version_converter")
    top = min(converter.SUPPORTED_MAX_ONNX_OPSET, onnx.defs.onnx_opset_version())
    assert supported_opsets() == range(converter.SUPPORTED_MIN_ONNX_OPSET, top + 1)


def test_onnx_export_of_a_model_built_for_sdpa_says_to_load_it_eager(tmp_path):
    pytest.importorskip("onnxscript")
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        export_onnx(tiny("chang2021-small/composite"), tmp_path / "model.onnx")
    assert not list(tmp_path.iterdir())


def test_an_opset_the_converter_could_not_reach_is_one_usage_error(tmp_path, monkeypatch):
    """The exporter kept an older opset than asked: a UsageError naming the one it wrote, and no file."""
    pytest.importorskip("onnxscript")
    stub = SimpleNamespace(model=SimpleNamespace(opset_imports={"": 18}), save=lambda path: Path(path).write_text(""))
    monkeypatch.setattr(torch.onnx, "export", lambda *args, **kwargs: stub)
    model = tiny("chang2021-small/composite", attn_implementation="eager")
    with pytest.raises(UsageError, match="stays at opset 18"):
        export_onnx(model, tmp_path / "model.onnx", opset=19)
    assert not list(tmp_path.iterdir())


def test_a_failed_write_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    pytest.importorskip("onnxscript")

    def disk_full(path):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    stub = SimpleNamespace(model=SimpleNamespace(opset_imports={"": 18}), save=disk_full)
    monkeypatch.setattr(torch.onnx, "export", lambda *args, **kwargs: stub)
    model = tiny("chang2021-small/composite", attn_implementation="eager")
    with pytest.raises(UsageError, match=r"could not write .*model\.onnx: No space left on device"):
        export_onnx(model, tmp_path / "model.onnx")
    assert not list(tmp_path.iterdir())


def test_load_saved_gives_the_saved_head_in_eval_mode_and_refuses_what_is_none(tmp_path):
    """The architecture config.json names (a headless encoder where it names none), in eval mode; a name that is no
    convattn model class is refused in one line."""
    from convattn import ConvAttnModel

    tiny("chang2021-small/composite", ConvAttnModel).save_pretrained(tmp_path / "encoder")
    config = json.loads((tmp_path / "encoder" / "config.json").read_text())
    del config["architectures"]
    (tmp_path / "encoder" / "config.json").write_text(json.dumps(config))
    loaded = load_saved(tmp_path / "encoder")
    assert type(loaded) is ConvAttnModel and not loaded.training
    config["architectures"] = ["electra"]  # a module of convattn's, no model class
    (tmp_path / "encoder" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not a convattn model"):
        load_saved(tmp_path / "encoder")


def test_load_saved_refuses_a_head_the_weights_do_not_hold(tmp_path):
    """A config naming a classifier over an encoder's weights: a random head exported as the model's is refused."""
    from convattn import ConvAttnModel

    tiny("chang2021-small/composite", ConvAttnModel).save_pretrained(tmp_path / "encoder")
    config = json.loads((tmp_path / "encoder" / "config.json").read_text())
    config["architectures"] = ["ConvAttnForSequenceClassification"]
    (tmp_path / "encoder" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="weights do not match the config"):
        load_saved(tmp_path / "encoder")
