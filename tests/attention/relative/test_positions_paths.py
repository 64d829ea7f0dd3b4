"""Rotary positions and ALiBi on every attention path, against the float64 loop references (helpers/reference.py):
outputs and every gradient, with padding, odd lengths, batches of several rows and packed sequences; and rotary
against transformers' own rotary functions (ModernBERT's) on the same queries and keys."""

from __future__ import annotations

import copy
import warnings
from functools import partial

import pytest
import torch
from helpers.reference import composite_attention_loops, mixed_attention_loops
from helpers.relative import (
    TERMS,
    MathKernel,
    batch,
    directional_derivatives,
    gradient_weights,
    kept_output_and_grads,
    make_convbert_layer,
    make_layer,
    output_and_grads,
)
from helpers.tiers import slow_except
from transformers import ModernBertConfig
from transformers.models.modernbert.modeling_modernbert import ModernBertRotaryEmbedding, apply_rotary_pos_emb

from convattn.attention import PackedSequences, TokenMask
from convattn.attention.relative import blockwise, decomposition, dispatch, kernels
from convattn.attention.rotary import rotate_queries_and_keys

# (position_embedding_type, relative terms): each alone and with composite attention's terms
CASES = {
    "rotary": ("rotary", []),
    "alibi": ("alibi", []),
    "composite+rotary": ("rotary", TERMS["composite"]),
    "composite+key+rotary": ("rotary", TERMS["composite+key"]),
    "composite+key+alibi": ("alibi", TERMS["composite+key"]),
    "composite+alibi": ("alibi", TERMS["composite"]),  # ALiBi's key constants on the CPU kernel's key mask
}
LENGTHS, N = (19, 8, 1), 19  # odd lengths, a row of mostly padding
HIDDEN = 64  # heads of 16 channels: the fused kernel's and FlexAttention's smallest


# float32 against float64: ConvBERT's layer at 1e-5 fails by 1.4e-5 in one output of its rotary heads out of 1,792
# (scores of randomised weights reach tens there, sharpening the softmax), and the decomposition with key-based
# terms by 1.3e-5 (ALiBi: of the gradients' scale in one of key.weight's 4,096; rotary: 1.8e-5 in one output of
# 1,792); in float64 both agree to 1e-10: `test_the_decomposition_is_exact_in_float64`
def tolerance(case: str, convbert: bool) -> float:
    kind, terms = CASES[case]
    return 3e-5 if convbert or kind == "alibi" or "dynamic_key" in terms else 1e-5


def layer_and_reference(case: str, convbert: bool):
    kind, terms = CASES[case]
    if convbert:
        layer = make_convbert_layer(terms, hidden_size=HIDDEN, position_embedding_type=kind)
        return layer, partial(mixed_attention_loops, layer, masked=True)
    layer = make_layer(terms, hidden_size=HIDDEN, position_embedding_type=kind, value_depthwise_conv=True)
    return layer, partial(composite_attention_loops, layer)


def padded_and_packed(layer, x, keep):
    """The layer on the padded batch, and on the same sequences packed into one stream, then padded back."""
    padded = layer(x, TokenMask(keep))[0]
    lengths = keep.sum(1)
    packed = layer(x[keep][None], PackedSequences.from_lengths(lengths))[0][0]
    return padded, padded.new_zeros(padded.shape).masked_scatter(keep[..., None], packed)


def assert_path_matches(layer, reference, tolerance=1e-5, case: tuple | None = None):
    """The layer, padded and packed, against `reference` in the output and every gradient. `case`: what built the
    layer (layer_and_reference's arguments), under which its reference is shared with the tests that build the same
    layer (`kept_output_and_grads`)."""
    x, keep = batch(LENGTHS, N, torch.float32, width=HIDDEN)
    params = [x, *layer.parameters()]
    expected, expected_grads = (output_and_grads(layer, x, keep, reference) if case is None
                                else kept_output_and_grads(case, layer, x, keep, reference))
    weights = gradient_weights(expected)
    real = keep[..., None].expand_as(expected)
    scale = max(g.abs().max().item() for g in expected_grads)
    for label, ours in zip(("padded", "packed"), padded_and_packed(layer, x, keep), strict=True):
        torch.testing.assert_close(ours.double()[real], expected[real], rtol=tolerance, atol=tolerance,
                                   msg=lambda m, label=label: f"{label}: {m}")
        grads = torch.autograd.grad((ours.double() * weights * keep[..., None]).sum(), params)
        names = ["input", *(name for name, _ in layer.named_parameters())]
        for name, got, want in zip(names, grads, expected_grads, strict=True):
            torch.testing.assert_close(got.double(), want.double(), rtol=tolerance, atol=tolerance * scale,
                                       msg=lambda m, name=name, label=label: f"{label}, {name}: {m}")


def kernel_cases_slow_except(cases: list[str], paths: list[str], kernel: str, fast: str,
                             kernel_cases: tuple[str, ...] | None = None) -> list:
    """(case, path, convbert) for every case, path and layer: the fused kernel's (seconds each under Triton's
    interpreter) for `kernel_cases` only (default: all), in the slow tier but for `fast`'s on the composite layer.
    The kernel's own cases, ALiBi and packed sequences included, are test_triton_attention's."""
    return [pytest.param(case, path, convbert, id=f"{case}-{path}-{'convbert' if convbert else 'composite'} layer",
                         marks=[pytest.mark.slow] if path == kernel and (case, convbert) != (fast, False) else [])
            for case in cases for path in paths for convbert in (False, True)
            if path != kernel or kernel_cases is None or case in kernel_cases]


@pytest.mark.parametrize(("case", "path", "convbert"), kernel_cases_slow_except(
    ["alibi", "composite+key+rotary", "composite+key+alibi", "composite+alibi"],
    ["dense", "decomposed", "blockwise", "triton"], "triton", "composite+key+alibi",
    kernel_cases=("alibi", "composite+key+rotary", "composite+key+alibi")))
def test_relative_paths_match_the_reference(case, path, convbert, monkeypatch):
    """Each path the dispatcher can take for score terms, forced; blocks of 8 queries so that the decomposition's
    fused calls and the blockwise path's blocks are several."""
    if path == "triton":
        pytest.importorskip("triton")
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 8)
    monkeypatch.setattr(blockwise, "block_size", lambda n, reach, tiling: 8)
    layer, reference = layer_and_reference(case, convbert)
    taken = []
    original = dispatch.relative_path
    monkeypatch.setattr(dispatch, "relative_path", lambda *args: taken.append(original(*args)) or taken[-1])
    monkeypatch.setattr(dispatch, "_packed_kernel_serves", lambda *args: False)  # packed: blocks, forced path
    with dispatch.forced_path(path):
        assert_path_matches(layer, reference, tolerance(case, convbert), case=(case, convbert))
    assert set(taken) == {path}


@pytest.mark.parametrize(("path", "convbert"), [
    pytest.param(path, convbert, id=f"{path}-{'convbert' if convbert else 'composite'} layer",
                 marks=[pytest.mark.slow] if path == "triton" else [])
    for path in ["dense", "decomposed", "blockwise", "triton"] for convbert in (False, True)])
def test_terms_read_the_rotated_projections_where_the_config_says_so(path, convbert, monkeypatch):
    """rotary_relative_terms "rotated" (what models saved before 2026-11-29 computed): the dynamic terms read the
    turned queries and keys on every path, against the reference that gives them the turned ones."""
    if path == "triton":
        pytest.importorskip("triton")
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 8)
    monkeypatch.setattr(blockwise, "block_size", lambda n, reach, tiling: 8)
    monkeypatch.setattr(dispatch, "_packed_kernel_serves", lambda *args: False)
    fields = dict(hidden_size=HIDDEN, position_embedding_type="rotary", rotary_relative_terms="rotated")
    if convbert:
        layer = make_convbert_layer(TERMS["composite+key"], **fields)
        reference = partial(mixed_attention_loops, layer, masked=True)
    else:
        layer = make_layer(TERMS["composite+key"], value_depthwise_conv=True, **fields)
        reference = partial(composite_attention_loops, layer)
    with dispatch.forced_path(path):
        assert_path_matches(layer, reference, tolerance("composite+key+rotary", convbert),
                            case=("composite+key+rotary, rotated", convbert))


# through the kernel: the cases whose terms it reads (rotary alone is the plain kernel on rotated projections)
@pytest.mark.parametrize(("case", "implementation", "convbert"), kernel_cases_slow_except(
    list(CASES), ["sdpa", "eager", "convattn_triton"], "convattn_triton", "composite+key+rotary",
    kernel_cases=("composite+key+rotary", "composite+key+alibi")))
def test_attn_implementations_match_the_reference(case, implementation, convbert):
    """By attn_implementation, as a model runs: SDPA applies rotary before its kernel; "convattn_triton" takes the
    fused kernel for padded rows and its variable-length interface for packed sequences."""
    if implementation == "convattn_triton":
        pytest.importorskip("triton")
    layer, reference = layer_and_reference(case, convbert)
    layer.config._attn_implementation = implementation
    assert_path_matches(layer, reference, tolerance(case, convbert), case=(case, convbert))


@pytest.mark.parametrize("path", slow_except(["dense", "decomposed", "blockwise", "triton"], "dense", "decomposed",
                                              "blockwise"))
def test_alibi_beside_terms_that_stop_at_their_window(path, monkeypatch):
    """relative_out_of_window "zero": the terms add nothing past r, ALiBi's -m_h |i - j| goes on at every offset (the
    decomposition's off-band constants come from ALiBi's table alone)."""
    if path == "triton":
        pytest.importorskip("triton")
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 8)
    monkeypatch.setattr(blockwise, "block_size", lambda n, reach, tiling: 8)
    monkeypatch.setattr(dispatch, "_packed_kernel_serves", lambda *args: False)
    layer = make_layer(TERMS["composite+key"], "zero", hidden_size=HIDDEN, position_embedding_type="alibi")
    with dispatch.forced_path(path):
        assert_path_matches(layer, partial(composite_attention_loops, layer), 3e-5)


@pytest.mark.parametrize("case", ["alibi", "composite+key+alibi", "composite+key+rotary"])
def test_the_decomposition_is_exact_in_float64(case, monkeypatch):
    """The float32 tolerances above are rounding: in float64 the decomposition, with its fused calls (blocks of 8),
    equals the loop reference to 1e-10 in the output and every gradient."""
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 8)
    kind, terms = CASES[case]
    layer = make_layer(terms, hidden_size=HIDDEN, position_embedding_type=kind, dtype=torch.float64)
    x, keep = batch(LENGTHS, N, torch.float64, width=HIDDEN)
    expected, expected_grads = output_and_grads(layer, x, keep, partial(composite_attention_loops, layer))
    with dispatch.forced_path("decomposed"):
        ours, grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x, TokenMask(keep))[0])
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=0, atol=1e-10)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("path", ["dense", "decomposed", "blockwise"])
@pytest.mark.parametrize("case", ["alibi", "composite+key+rotary", "composite+key+alibi"])
def test_backward_replays_the_forward_dropout_on_every_cpu_path(case, path, monkeypatch):
    """With attention dropout, float64: the gradient along a random direction equals the central difference of the
    seeded forward only if backward drops what forward dropped (the fused kernel's replay: test_triton_attention).
    The decomposition runs on the explicit stand-in for the fused kernels (CPU's flash kernel has no dropout)."""
    monkeypatch.setattr(dispatch, "fused_kernel", lambda device, dtype: MathKernel("blocks"))
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 8)
    monkeypatch.setattr(blockwise, "block_size", lambda n, reach, tiling: 8)
    kind, terms = CASES[case]
    layer = make_layer(terms, hidden_size=HIDDEN, position_embedding_type=kind, dtype=torch.float64)
    x, keep = batch((21, 12), 21, torch.float64, width=HIDDEN)
    with dispatch.forced_path(path):
        analytic, numeric, dropped = directional_derivatives(layer, x, keep, 0.3)
        _, _, undropped = directional_derivatives(layer, x, keep, 0.0)
    assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-8)
    assert dropped != pytest.approx(undropped, rel=1e-3)  # the masks did drop probabilities


@pytest.mark.parametrize("case", ["alibi", "composite+key+alibi"])
def test_half_precision_decomposition_with_alibi_attends_in_float32(case, monkeypatch):
    """ALiBi's per-key constants reach m n / 2: in bfloat16 they would lose whole units, so the decomposition takes
    float32 operands (here n = 300, where a bfloat16 key column would be off by up to 0.5 in a score)."""
    kind, terms = CASES[case]
    layer = make_layer(terms, hidden_size=HIDDEN, position_embedding_type=kind).eval()
    x, keep = batch((300, 170), 300, torch.float32, width=HIDDEN)
    with torch.no_grad(), dispatch.forced_path("dense"):
        single = layer(x, TokenMask(keep))[0]
    layer.bfloat16()
    with torch.no_grad(), dispatch.forced_path("decomposed"):
        half = layer(x.bfloat16(), TokenMask(keep))[0]
    real = keep[..., None].expand_as(single)
    error = (half.float() - single)[real].norm() / single[real].norm()
    assert error < 2e-2


@pytest.mark.parametrize("case", ["alibi", "composite+key+alibi"])
def test_half_precision_decomposition_with_alibi_is_the_float32_one_rounded_once(case):
    """The operands as they are, bfloat16 (exactly the float32 values), n = 300 with a padded row: the decomposition's
    output is the float32 decomposition's rounded to bfloat16, bit for bit; that one is the float64 dense bias's to
    float32's rounding. In bfloat16 the key constants (m n / 2) would lose whole units."""
    kind, terms = CASES[case]
    relative = make_layer(terms, hidden_size=HIDDEN, position_embedding_type=kind).relative
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 300, 16, generator=generator).bfloat16() for _ in range(3))
    mask = TokenMask(torch.arange(300)[None] < torch.tensor([300, 170])[:, None])

    def attention(q, k, v, relative, path):
        with torch.no_grad(), dispatch.forced_path(path):
            return dispatch.relative_attention(q, k, v, relative, mask, dropout_p=0.0, attn_implementation="sdpa")[0]

    half = attention(q, k, v, relative, "decomposed")
    single = attention(q.float(), k.float(), v.float(), relative, "decomposed")
    expected = attention(q.double(), k.double(), v.double(), copy.deepcopy(relative).double(), "dense")
    assert half.dtype == torch.bfloat16 and torch.equal(half, single.bfloat16())
    real = mask.keep[:, None, :, None].expand_as(expected)
    torch.testing.assert_close(single.double()[real], expected[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("terms", "out_of_window", "call"), [
    pytest.param([], "clip", (16, True), id="alibi"),
    pytest.param(TERMS["composite"], "clip", (16, True), id="composite+alibi"),
    pytest.param(TERMS["composite+key"], "zero", (16, True), id="composite+key+alibi, zero"),
    # control: dynamic_key's constants take gradients, on a key column beside the head's channels
    pytest.param(TERMS["composite+key"], "clip", (17, False), id="composite+key+alibi, clip"),
])
def test_alibis_key_constants_ride_on_the_cpu_kernels_key_mask(terms, out_of_window, call, monkeypatch):
    """Where the per-key constants are ALiBi's alone (no dynamic_key, or one that stops at its window), they take no
    gradient and the CPU kernel's key mask carries them: every fused call takes the head's 16 channels and a mask,
    none a column more."""
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 8)
    calls = []
    original = kernels.CpuFlashKernel.forward
    monkeypatch.setattr(kernels.CpuFlashKernel, "forward", lambda self, q, k, v, **options: calls.append(
        (q.shape[-1], options["key_mask"] is not None)) or original(self, q, k, v, **options))
    layer = make_layer(terms, out_of_window, hidden_size=HIDDEN, position_embedding_type="alibi")
    x, keep = batch(LENGTHS, N, torch.float32, width=HIDDEN)
    with dispatch.forced_path("decomposed"):
        layer(x, TokenMask(keep))[0].sum().backward()
    assert calls and set(calls) == {call}


@pytest.mark.parametrize("case", list(CASES))
def test_flex_forward_matches_the_reference_on_cpu(case):
    """torch 2.13 has no CPU backward for flex_attention: the forward only, eagerly, in float64 (exact, where float32
    rounds to about 1e-5 here, the tolerance's size)."""
    layer, reference = layer_and_reference(case, convbert=False)
    layer.config._attn_implementation = "flex_attention"
    layer.double().eval()
    x, keep = batch(LENGTHS, N, torch.float64, width=HIDDEN)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention's "eager mode is unoptimised" notice
        ours = layer(x, TokenMask(keep))[0]
    expected = reference(x.detach(), keep)
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=0, atol=1e-10)


@pytest.mark.parametrize("pairs", [False, True], ids=["halves", "pairs"])
@pytest.mark.parametrize("theta", [10_000.0, 160_000.0])  # ModernBERT's local and global layers
def test_rotary_equals_transformers_modernbert(theta, pairs):
    """Both layouts: rotate-half's, and the pair order the attention modules take (put back in halves here)."""
    batch_size, heads, n, d = 2, 4, 13, 16
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(batch_size, heads, n, d, generator=generator) for _ in range(2))
    positions = torch.stack([torch.arange(n), torch.cat([torch.arange(6), torch.arange(7)])])  # two sequences
    config = ModernBertConfig(hidden_size=heads * d, num_attention_heads=heads)
    config.rope_parameters["full_attention"]["rope_theta"] = theta
    cos, sin = ModernBertRotaryEmbedding(config)(q, positions, "full_attention")
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin)

    def heads_last(x):  # (batch, heads, n, d) -> (batch, n, heads * d), the layout the attention modules rotate
        return x.transpose(1, 2).flatten(2)

    def halves(x):  # each head's channel pairs (c, c + d/2) side by side -> c's first, then c + d/2's
        return x.unflatten(-1, (heads, d // 2, 2)).transpose(-1, -2).flatten(-3) if pairs else x

    ours_q, ours_k = map(halves, rotate_queries_and_keys(heads_last(q), heads_last(k), positions, heads, theta,
                                                         pairs=pairs))
    torch.testing.assert_close(ours_q, heads_last(expected_q), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours_k, heads_last(expected_k), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rotary_pairs_leave_every_score_as_the_halves_give_it(dtype):
    """The pair order is a reordering of each head's channels, the same for queries and keys: q . k and the
    gradients reaching the projections are rotate-half's (in float32 for bfloat16 inputs, as rotate-half turns)."""
    batch_size, heads, n, d = 2, 3, 11, 8
    generator = torch.Generator().manual_seed(1)
    q, k = (torch.randn(batch_size, n, heads * d, generator=generator).to(dtype).requires_grad_()
            for _ in range(2))
    positions = torch.cat([torch.arange(4), torch.arange(7)])[None]
    probe = torch.randn(batch_size, heads, n, n, generator=generator, dtype=torch.float64)
    results = []
    for pairs in (False, True):
        turned = rotate_queries_and_keys(q, k, positions, heads, 10_000.0, pairs=pairs)
        assert all(t.dtype == dtype for t in turned)
        rq, rk = (t.double().unflatten(-1, (heads, d)).transpose(1, 2) for t in turned)
        scores = rq @ rk.transpose(-1, -2)
        results.append((scores, *torch.autograd.grad((scores * probe).sum(), (q, k))))
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    for halves, pairs in zip(*results, strict=True):
        torch.testing.assert_close(pairs.double(), halves.double(), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_turned_projections_equal_the_projections_turned_in_halves(dtype):
    """Projecting in pair order (the weights' rows reordered) and turning gives rotate-half's scores and the same
    gradients for the input and both projections' weights and biases; a hooked or other projection declines."""
    from torch import nn

    from convattn.attention.rotary import turned_projections

    torch.manual_seed(3)
    heads, d, n = 3, 8, 11
    hidden = torch.randn(2, n, 16, dtype=dtype, requires_grad=True)
    query, key = (nn.Linear(16, heads * d).to(dtype) for _ in range(2))
    positions = torch.cat([torch.arange(4), torch.arange(7)])[None]
    probe = torch.randn(2, heads, n, n, dtype=torch.float64)
    params = [hidden, query.weight, query.bias, key.weight, key.bias]
    results = []
    for turned in (turned_projections(hidden, query, key, positions, heads, 10_000.0),
                   rotate_queries_and_keys(query(hidden), key(hidden), positions, heads, 10_000.0)):
        rq, rk = (t.double().unflatten(-1, (heads, d)).transpose(1, 2) for t in turned)
        scores = rq @ rk.transpose(-1, -2)
        results.append((scores, *torch.autograd.grad((scores * probe).sum(), params)))
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    for pairs, halves in zip(*results, strict=True):
        torch.testing.assert_close(pairs.double(), halves.double(), rtol=tolerance, atol=tolerance)
    handle = query.register_forward_hook(lambda *args: None)
    assert turned_projections(hidden, query, key, positions, heads, 10_000.0) is None
    handle.remove()
    assert turned_projections(hidden, nn.Sequential(query), key, positions, heads, 10_000.0) is None
