"""ALiBi alone on CPU through one flash call with its bias as a strided view (attention/relative/toeplitz.py): the
output and every gradient against a dense float64 reference, with padding as a prefix (runs of rows sharing a call),
anywhere else (the pad channel), rows of pads alone, and as a traced graph computes it; the layers against the loop
references, padded and packed; which path the dispatcher takes; and that no (n x n) tensor is made."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from helpers.reference import composite_attention_loops, mixed_attention_loops
from helpers.relative import TERMS, batch, make_convbert_layer, make_layer, output_and_grads
from torch.utils._python_dispatch import TorchDispatchMode

from convattn.attention import PackedSequences, TokenMask
from convattn.attention.relative import dispatch, toeplitz
from convattn.attention.relative.bias import alibi_slopes
from convattn.attention.relative.toeplitz import toeplitz_alibi_attention

N, HEADS, D = 13, 6, 8  # 6 heads: slopes of a head count that is not a power of two


def keep_rows(n: int) -> torch.Tensor:
    """Rows padded every way the path tells apart: whole; a prefix of 7 twice (one call), then of 1; padding in
    front and in holes (the pad channel); a row of pads alone; whole again."""
    rows = [torch.ones(n, dtype=torch.bool), torch.arange(n) < 7, torch.arange(n) < 7, torch.arange(n) < 1,
            torch.arange(n) >= 4, torch.arange(n) % 3 != 1, torch.zeros(n, dtype=torch.bool),
            torch.ones(n, dtype=torch.bool)]
    return torch.stack(rows)


def dense_reference(q, k, v, slopes, keep):
    """softmax(q k^T / sqrt(d) - m_h |i - j|, pad keys excluded) v in float64, every (n x n) matrix built."""
    n, d = q.shape[-2], q.shape[-1]
    positions = torch.arange(n, dtype=torch.float64)
    bias = -slopes.double()[:, None, None] * (positions[:, None] - positions[None, :]).abs()
    scores = (q.double() @ k.double().mT) * d ** -0.5 + bias
    scores = scores.masked_fill(~keep[:, None, None, :], torch.finfo(torch.float64).min)  # finite for a row of pads
    return scores.softmax(-1) @ v.double()


def inputs(dtype, batch_size):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(batch_size, HEADS, N, D, generator=generator, dtype=torch.float64).to(dtype).requires_grad_()
            for _ in range(3)]


def outputs_and_gradients(attend, tensors, keep):
    """The output and q, k, v's gradients of a fixed projection of the rows that have a real key (their queries
    all attend to real keys; a row of pads alone has none to attend to)."""
    out = attend(*tensors)
    has_keys = keep.any(-1)[:, None, None, None].to(torch.float64)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad((out.double() * weights * has_keys).sum(), tensors)
    return out.double(), [g.double() for g in grads]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "as traced (pad channel for every row)"])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_output_and_gradients_equal_the_dense_reference_with_padding_every_way(dtype, tolerance, traced,
                                                                             monkeypatch):
    if traced:
        monkeypatch.setattr(toeplitz, "is_tracing", lambda: True)
    keep = keep_rows(N)
    slopes = torch.tensor(alibi_slopes(HEADS), dtype=dtype)
    tensors = inputs(dtype, len(keep))
    ours, our_grads = outputs_and_gradients(
        lambda q, k, v: toeplitz_alibi_attention(q, k, v, slopes, TokenMask(keep)), tensors, keep)
    expected, expected_grads = outputs_and_gradients(
        lambda q, k, v: dense_reference(q, k, v, slopes, keep), tensors, keep)
    has_keys = keep.any(-1)
    torch.testing.assert_close(ours[has_keys], expected[has_keys], rtol=tolerance, atol=tolerance)
    assert ours[~has_keys].isfinite().all()
    for name, got, want in zip("qkv", our_grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("padded", [False, None], ids=["unpadded mask", "no mask"])
def test_a_batch_without_padding_is_one_call_with_its_bias_a_view(padded):
    """No row padded, or no mask: one flash call; the bias reaches it as a (1, heads, n, n) view of (heads, 2n - 1)
    numbers."""
    slopes = torch.tensor(alibi_slopes(HEADS))
    q, k, v = inputs(torch.float32, 3)
    calls = []

    class Calls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:
                calls.append(kwargs["attn_mask"])
            return func(*args, **(kwargs or {}))

    keep = torch.ones(3, N, dtype=torch.bool)
    with Calls():
        ours = toeplitz_alibi_attention(q, k, v, slopes, None if padded is None else TokenMask(keep))
    (bias,) = calls
    assert bias.shape == (1, HEADS, N, N) and bias.untyped_storage().nbytes() == HEADS * (2 * N - 1) * 4
    torch.testing.assert_close(ours.double(), dense_reference(q, k, v, slopes, keep), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "as traced"])
def test_rows_of_one_prefix_length_share_a_call_without_the_pad_channel(traced, monkeypatch):
    """keep_rows, one call per run of rows: whole (all N keys), two rows of a prefix of 7 (one call, on their first 7
    keys), a prefix of 1, two rows padded elsewhere (one call on the pad channel: head size D + 1), a row of pads alone
    (all N keys), whole. A traced graph (no branch on the data) makes one call, every row on the pad channel. Each
    call as (rows, keys, head size)."""
    if traced:
        monkeypatch.setattr(toeplitz, "is_tracing", lambda: True)
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, v, **kwargs: calls.append((q.shape[0], k.shape[-2], q.shape[-1]))
                        or sdpa(q, k, v, **kwargs))
    keep = keep_rows(N)
    q, k, v = inputs(torch.float32, len(keep))
    with torch.no_grad():
        toeplitz_alibi_attention(q, k, v, torch.tensor(alibi_slopes(HEADS)), TokenMask(keep))
    if traced:
        assert calls == [(len(keep), N, D + 1)]
    else:
        assert calls == [(1, N, D), (2, 7, D), (1, 1, D), (2, N, D + 1), (1, N, D), (1, N, D)]


class StorageSizes(TorchDispatchMode):
    """The largest storage any operator returned, in elements, and the operators called."""

    def __init__(self):
        super().__init__()
        self.largest, self.called = 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.called.add(func)
        for t in out if isinstance(out, tuple | list) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes() // t.element_size())
        return out


@pytest.mark.parametrize("make", [make_layer, make_convbert_layer])
def test_alibi_layers_never_build_an_n_by_n_tensor_on_cpu(make):
    """From 256 tokens on (600 here too), training mode, forward and backward, padded rows: the CPU flash kernel
    serves, and no storage holds n x n numbers."""
    torch.set_flush_denormal(True)  # as the command line runs (conftest gives the state back)
    layer = make([], hidden_size=64, position_embedding_type="alibi")
    for n in (dispatch.CPU_DECOMPOSED_MIN_LENGTH, 600):
        x, keep = batch((n, n // 3), n, torch.float32, width=64)
        with StorageSizes() as recorded:
            layer(x, TokenMask(keep))[0].sum().backward()
        assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in recorded.called
        assert recorded.largest < n * n


LENGTHS, LAYER_N = (19, 8, 1), 19


@pytest.mark.parametrize("convbert", [False, True], ids=["composite layer", "convbert layer"])
def test_alibi_layers_equal_the_loop_reference_padded_and_packed(convbert, monkeypatch):
    """float64, the path forced (the dispatcher takes it from 256 tokens on, too long for the loop reference), padded
    and the same sequences packed into one stream (blocks of similar lengths, padded again): output and every
    gradient."""
    fields = dict(hidden_size=64, position_embedding_type="alibi", dtype=torch.float64)
    if convbert:
        layer = make_convbert_layer([], **fields)
        reference = partial(mixed_attention_loops, layer, masked=True)
    else:
        layer = make_layer([], value_depthwise_conv=True, **fields)
        reference = partial(composite_attention_loops, layer)
    x, keep = batch(LENGTHS, LAYER_N, torch.float64, width=64)
    expected, expected_grads = output_and_grads(layer, x, keep, reference)
    taken = []
    original = dispatch.relative_path
    monkeypatch.setattr(dispatch, "relative_path", lambda *args: taken.append(original(*args)) or taken[-1])
    monkeypatch.setattr(dispatch, "_packed_kernel_serves", lambda *args: False)  # (on CPU it is; its probe uncounted)

    def packed(x, keep):
        out = layer(x[keep][None], PackedSequences.from_lengths(keep.sum(1)))[0][0]
        return x.new_zeros(*keep.shape, out.shape[-1]).masked_scatter(keep[..., None], out)

    for label, forward in (("padded", lambda x, keep: layer(x, TokenMask(keep))[0]), ("packed", packed)):
        with dispatch.forced_path("toeplitz"):
            ours, grads = output_and_grads(layer, x, keep, forward)
        real = keep[..., None].expand_as(ours)
        torch.testing.assert_close(ours[real], expected[real], rtol=0, atol=1e-10,
                                   msg=lambda m, label=label: f"{label}: {m}")
        for got, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-10, msg=lambda m, label=label: f"{label}: {m}")
    assert set(taken) == {"toeplitz"}


@pytest.mark.parametrize("n", [dispatch.CPU_DECOMPOSED_MIN_LENGTH, dispatch.CPU_BLOCKWISE_MIN_LENGTH])
def test_the_dispatcher_takes_it_for_alibi_alone_on_cpu_without_dropout(n):
    q = torch.empty(1, 1, n, 64)
    short = torch.empty(1, 1, dispatch.CPU_DECOMPOSED_MIN_LENGTH - 1, 64)
    assert dispatch.relative_path(short, "sdpa", 0.0, False, True) == "dense"  # as fast there, and small
    assert dispatch.relative_path(q, "sdpa", 0.0, False, True) == "toeplitz"
    assert dispatch.relative_path(q.bfloat16(), "sdpa", 0.0, False, True) == "toeplitz"
    assert dispatch.relative_path(q, "sdpa", 0.0, False, False) != "toeplitz"  # terms beside ALiBi
    assert dispatch.relative_path(q, "sdpa", 0.1, False, True) != "toeplitz"  # the CPU kernel has no dropout
    assert dispatch.relative_path(q, "sdpa", 0.0, True, True) == "dense"  # attention maps
    assert dispatch.relative_path(q, "eager", 0.0, False, True) == "dense"
    assert dispatch.relative_path(q, "flex_attention", 0.0, False, True) == "flex"


@pytest.mark.parametrize("terms, dropout, says", [(TERMS["composite"], 0.0, "relative terms beside ALiBi"),
                                                  ([], 0.1, "dropout on its probabilities")])
def test_forcing_it_where_it_does_not_apply_says_why(terms, dropout, says):
    layer = make_layer(terms, hidden_size=64, position_embedding_type="alibi")
    layer.dropout_p = dropout
    x, keep = batch((9, 5), 9, torch.float32, width=64)
    with dispatch.forced_path("toeplitz"), pytest.raises(ValueError, match=says):
        layer(x, TokenMask(keep))


def test_half_precision_attends_in_float32():
    """The bias reaches m_h n: bfloat16 operands attend in float32 and come back in bfloat16 (n = 300, where a
    bfloat16 bias would be off by up to 0.5 in a score)."""
    layer = make_layer([], hidden_size=64, position_embedding_type="alibi").eval()
    x, keep = batch((300, 170), 300, torch.float32, width=64)
    with torch.no_grad():
        single = layer(x, TokenMask(keep))[0]
        layer.bfloat16()
        half = layer(x.bfloat16(), TokenMask(keep))[0]
    assert half.dtype == torch.bfloat16
    real = keep[..., None].expand_as(single)
    assert (half.float() - single)[real].norm() / single[real].norm() < 2e-2


@pytest.mark.parametrize("terms", [["fixed"], ["dynamic_query"], TERMS["composite"]])
def test_alibi_beside_relative_terms_keeps_them_past_the_dense_lengths(terms, monkeypatch):
    """With terms beside ALiBi the dispatcher does not take the view (which carries ALiBi alone): at 256 tokens the
    layer equals the dense bias's, terms included, through the decomposition."""
    layer = make_layer(terms, hidden_size=64, position_embedding_type="alibi").eval()
    n = dispatch.CPU_DECOMPOSED_MIN_LENGTH
    x, keep = batch((n, n // 3), n, torch.float32, width=64)
    with torch.no_grad(), dispatch.forced_path("dense"):
        dense = layer(x, TokenMask(keep))[0]
    taken = []
    original = dispatch.relative_path
    monkeypatch.setattr(dispatch, "relative_path", lambda *args: taken.append(original(*args)) or taken[-1])
    torch.set_flush_denormal(True)  # as the command line runs (conftest gives the state back)
    with torch.no_grad():
        ours = layer(x, TokenMask(keep))[0]
    assert taken == ["decomposed"]
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], dense[real], rtol=1e-5, atol=1e-5)
