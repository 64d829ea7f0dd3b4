"""Padding-free batches: flattened rows (transformers' DataCollatorWithFlattening layout) and padded batches run
on their real tokens only, against each sequence computed alone and against today's padded computation."""

from __future__ import annotations

import pytest
import torch
from helpers.tiers import slow_except
from helpers.tiny import randomize_, tiny_config
from transformers import DataCollatorWithFlattening

import convattn.padding_free as routing
from convattn import ConvAttnForQuestionAnswering, ConvAttnForSequenceClassification, ConvAttnModel
from convattn.presets import preset_names

# the presets: every mechanism that mixes positions (absolute positions, relative terms with and
# without the key term, the depthwise value convolution, convolutional Q/K/V, both ConvBERT variants)
FLATTENED_PRESETS = [
    "chang2021-small/absolute",
    "chang2021-small/composite",
    "chang2021-small/composite+key",
    "chang2021-small/composite+depthwise",
    "chang2021-small/conv-qkv",
    "convbert/small",
    "chang2021-small/convbert",
]
PACKABLE_PRESETS = [p for p in preset_names() if not p.startswith("chang2021-base/") and "linformer" not in p]
LENGTHS = [19, 8, 1, 12]  # odd lengths, one of a single token, longer than the conv kernels' reach and shorter


def tiny_model(preset: str, cls=ConvAttnModel, **overrides):
    torch.manual_seed(0)
    model = cls(tiny_config(preset, **overrides))
    randomize_(model)
    return model.double().eval()


def sequences(lengths=LENGTHS, seed=1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 101, (length,), generator=generator) for length in lengths]


def flattened(seqs) -> dict:
    return dict(input_ids=torch.cat(seqs)[None], position_ids=torch.cat([torch.arange(len(s)) for s in seqs])[None])


def padded(seqs, extra: int = 0) -> dict:
    n = max(len(s) for s in seqs) + extra
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    keep = torch.zeros(len(seqs), n, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)], keep[b, : len(s)] = s, 1
    return dict(input_ids=ids, attention_mask=keep)


def weighted_sum_and_grads(model, outputs: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad()
    (outputs * weights).sum().backward()
    return outputs.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("preset", slow_except(FLATTENED_PRESETS, *FLATTENED_PRESETS[:3], *FLATTENED_PRESETS[5:]))
def test_a_flattened_batch_computes_each_sequence_as_if_alone(preset):
    model = tiny_model(preset)
    seqs = sequences()
    weights = torch.randn(sum(LENGTHS), 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out, grads = weighted_sum_and_grads(model, model(**flattened(seqs)).last_hidden_state[0], weights)
    alone_out = torch.cat([model(input_ids=s[None]).last_hidden_state[0] for s in seqs])
    alone, alone_grads = weighted_sum_and_grads(model, alone_out, weights)
    torch.testing.assert_close(out, alone, rtol=1e-5, atol=1e-5)
    assert grads.keys() == alone_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], alone_grads[name], rtol=1e-5, atol=1e-5, msg=name)


def test_flattened_batches_take_flash_attention_offsets_and_the_collator_layout():
    """DataCollatorWithFlattening with its FlashAttention kwargs (cu_seq_lens_q / max_length_q and _k): the offsets
    alone say where the sequences are, and agree with the restarting position_ids."""
    model = tiny_model("chang2021-small/composite+depthwise")
    seqs = sequences()
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": s.tolist()} for s in seqs])
    assert set(batch) >= {"input_ids", "position_ids", "cu_seq_lens_q", "max_length_q"}
    with torch.no_grad():
        by_offsets = model(
            input_ids=batch["input_ids"], cu_seq_lens_q=batch["cu_seq_lens_q"], max_length_q=batch["max_length_q"]
        ).last_hidden_state
        by_everything = model(**{k: v for k, v in batch.items() if k != "labels"}).last_hidden_state
        by_positions = model(**flattened(seqs)).last_hidden_state
    torch.testing.assert_close(by_offsets, by_positions, rtol=0, atol=0)
    torch.testing.assert_close(by_everything, by_positions, rtol=0, atol=0)


def test_inconsistent_flash_attention_offsets_are_refused():
    model = tiny_model("chang2021-small/composite")
    ids = torch.cat(sequences())[None]
    with pytest.raises(ValueError, match="cu_seq_lens_q must rise from 0"):
        model(input_ids=ids, cu_seq_lens_q=torch.tensor([0, 5, 7]))
    with pytest.raises(ValueError, match="cu_seq_lens_k must equal cu_seq_lens_q"):
        model(input_ids=ids, cu_seq_lens_q=torch.tensor([0, 19, 40]), cu_seq_lens_k=torch.tensor([0, 20, 40]))


def test_one_row_with_consecutive_positions_is_one_sequence():
    model = tiny_model("chang2021-small/composite")
    ids = torch.cat(sequences())[None]
    with torch.no_grad():
        torch.testing.assert_close(
            model(input_ids=ids, position_ids=torch.arange(40)[None]).last_hidden_state,
            model(input_ids=ids).last_hidden_state,
            rtol=0,
            atol=0,
        )


def test_linformer_refuses_flattened_batches_and_keeps_padded_ones():
    model = tiny_model("malard/linformer-n128-k32")
    assert not model.takes_packed_sequences
    with pytest.raises(ValueError, match="Linformer layers project keys and values along a fixed sequence length"):
        model(**flattened(sequences()))
    batch = padded(sequences())
    with torch.no_grad():
        out = model(**batch).last_hidden_state
    assert out[batch["attention_mask"] == 0].abs().sum() > 0  # the padded path: pad rows are computed


def test_sequence_classification_of_a_flattened_batch_reads_each_sequence_first_token():
    model = tiny_model("chang2021-small/composite", cls=ConvAttnForSequenceClassification, num_labels=3)
    seqs = sequences()
    with torch.no_grad():
        logits = model(**flattened(seqs)).logits
        alone = torch.cat([model(input_ids=s[None]).logits for s in seqs])
    assert logits.shape == (len(seqs), 3)
    torch.testing.assert_close(logits, alone, rtol=1e-5, atol=1e-5)


def test_question_answering_refuses_flattened_batches():
    model = tiny_model("chang2021-small/composite", cls=ConvAttnForQuestionAnswering)
    with pytest.raises(ValueError, match="question answering takes padded batches"):
        model(**flattened(sequences()))


@pytest.fixture
def route(monkeypatch):
    """route("padded") / route("padding-free"): which way the next padded batches go."""

    def choose(name: str) -> None:
        monkeypatch.setattr(routing, "UNPAD_BELOW_REAL_FRACTION", {"cpu": {"padded": 0.0, "padding-free": 1.0}[name]})

    return choose


@pytest.mark.parametrize("preset", PACKABLE_PRESETS)
def test_a_padded_batch_run_padding_free_gives_todays_outputs_and_gradients(preset, route):
    model = tiny_model(preset).train()  # the tiny configs have no dropout
    batch = padded(sequences(), extra=3)
    keep = batch["attention_mask"].bool()
    weights = torch.randn(*keep.shape, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    weights = weights * keep[..., None]  # a loss of the real positions only
    route("padded")
    today, today_grads = weighted_sum_and_grads(model, model(**batch).last_hidden_state, weights)
    route("padding-free")
    out, grads = weighted_sum_and_grads(model, model(**batch).last_hidden_state, weights)
    torch.testing.assert_close(out[keep], today[keep], rtol=1e-5, atol=1e-5)
    assert not out[~keep].any()  # the pad positions are zeros on the padding-free route
    assert grads.keys() == today_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], today_grads[name], rtol=1e-5, atol=1e-5, msg=name)


def test_hidden_states_come_back_padded_and_token_types_and_positions_follow_their_tokens(route):
    model = tiny_model("chang2021-small/absolute").train()
    batch = padded(sequences(), extra=2)
    keep = batch["attention_mask"].bool()
    batch["token_type_ids"] = (torch.arange(keep.shape[1]) > 4).long().expand_as(keep)
    batch["position_ids"] = torch.arange(keep.shape[1])[None] + 1
    outputs = {}
    for name in ("padded", "padding-free"):
        route(name)
        with torch.no_grad():
            outputs[name] = model(**batch, output_hidden_states=True).hidden_states
    assert len(outputs["padded"]) == len(outputs["padding-free"]) == 3
    for today, ours in zip(outputs["padded"], outputs["padding-free"], strict=True):
        assert ours.shape == today.shape
        torch.testing.assert_close(ours[keep], today[keep], rtol=1e-5, atol=1e-5)


def test_batches_whose_pads_matter_stay_padded(route):
    """A row of pads alone, left padding, ConvBERT's reference padding (pads reach its convolution), attention maps
    asked for, evaluation and inference, and the span QA head's encoder (its loss reads every position) keep today's
    padded computation, pad rows included."""
    route("padding-free")
    batch = padded(sequences())
    left = {k: v.flip(1) for k, v in batch.items()}
    empty_row = {k: v.clone() for k, v in batch.items()}
    empty_row["attention_mask"][-1] = 0
    qa = tiny_model("chang2021-small/composite", cls=ConvAttnForQuestionAnswering)
    assert not qa.convattn.runs_padding_free
    cases = [
        (tiny_model("chang2021-small/composite").train(), empty_row, {}),  # a row of pads alone
        (qa.convattn.train(), batch, {}),
        (tiny_model("chang2021-small/composite").train(), left, {}),
        (tiny_model("convbert/small", convbert_padding="reference").train(), batch, {}),
        (tiny_model("chang2021-small/composite").train(), batch, {"output_attentions": True}),
        (tiny_model("chang2021-small/composite").eval(), batch, {}),  # evaluation gives every position as before
    ]
    for model, inputs, options in cases:
        with torch.no_grad():
            out = model(**inputs, **options).last_hidden_state
        assert out[inputs["attention_mask"] == 0].abs().sum() > 0


def test_the_real_fraction_threshold_is_strict():
    """Padding-free below 90 % real tokens (UNPAD_BELOW_REAL_FRACTION): exactly 90 % stays padded."""
    model = tiny_model("chang2021-small/composite").train()
    keep = torch.ones(4, 10, dtype=torch.long)
    keep[3, 6:] = 0  # 36 of 40
    assert not routing.worth_unpadding(model, keep)
    keep[3, 5] = 0  # 35 of 40
    assert routing.worth_unpadding(model, keep)


def test_batches_with_little_padding_stay_padded():
    model = tiny_model("chang2021-small/composite").train()
    batch = padded(sequences([20, 20, 20, 19]))
    with torch.no_grad():
        out = model(**batch).last_hidden_state
    assert out[batch["attention_mask"] == 0].abs().sum() > 0


def test_the_fused_kernel_takes_packed_sequences_through_its_variable_length_interface(monkeypatch):
    """attn_implementation="convattn_triton" (the Triton interpreter on CPU): a flattened batch reaches the kernel
    as packed sequences with cu_seqlens, and gives each sequence as computed alone."""
    from convattn.attention.relative import triton_attention

    calls = []
    kernel = triton_attention.triton_relative_attention
    monkeypatch.setattr(
        triton_attention,
        "triton_relative_attention",
        lambda *args, **kwargs: calls.append(kwargs.get("cu_seqlens")) or kernel(*args, **kwargs),
    )
    model = tiny_model("chang2021-small/composite+key", num_hidden_layers=1).float()
    model.set_attn_implementation("convattn_triton")
    seqs = sequences([5, 3])
    with torch.no_grad():
        out = model(**flattened(seqs)).last_hidden_state[0]
        assert calls and calls[0].tolist() == [0, 5, 8]
        alone = torch.cat([model(input_ids=s[None]).last_hidden_state[0] for s in seqs])
    torch.testing.assert_close(out, alone, rtol=1e-5, atol=1e-5)
