"""The exact decomposition of relative attention (attention/relative/decomposition.py): outputs and every gradient
against the float64 loop references, for composite attention and ConvBERT's heads, through both tilings and
three kernels: the CPU flash kernel cut in blocks (what CPU runs), the CPU flash kernel with the CUDA tiling (one
causal call per far side), and an explicit kernel shaped as the CUDA ones (pads on the key column, dropout from
a replayable seed). On a CUDA machine the same tests also run the CUDA kernels."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from helpers.reference import composite_attention_loops, mixed_attention_loops
from helpers.relative import (
    TERMS,
    MathKernel,
    batch,
    directional_derivatives,
    kept_output_and_grads,
    make_convbert_layer,
    make_layer,
    output_and_grads,
)
from helpers.tiers import slow_except
from torch.utils._python_dispatch import TorchDispatchMode

from convattn.attention import TokenMask
from convattn.attention.relative import RelativePositionBias, decomposition, dispatch, kernels
from convattn.attention.relative.decomposition import decomposed_relative_attention
from convattn.attention.relative.kernels import CPU_FLASH, CUDA_FLASH, CpuFlashKernel


def cpu_flash_causal() -> CpuFlashKernel:
    kernel = CpuFlashKernel()
    kernel.tiling = "causal"
    return kernel


KERNELS = {"cpu flash, blocks": CPU_FLASH, "cpu flash, causal": cpu_flash_causal(), "math, causal": MathKernel(),
           "math, blocks": MathKernel("blocks")}


@pytest.fixture
def use_kernel(monkeypatch):
    """Route every relative-attention call of the layers through the decomposition with the given kernel."""
    def use(kernel):
        monkeypatch.setattr(dispatch, "relative_path", lambda *args: "decomposed")
        monkeypatch.setattr(dispatch, "fused_kernel", lambda device, dtype: kernel)
    return use


def assert_every_kernel_matches(layer, x, keep, reference, tolerance, use_kernel, case: tuple | None = None):
    """The layer through the decomposition with each kernel of KERNELS: output and every gradient as `reference`.
    `case`: what built the layer and the batch, under which the reference is shared with the tests that build the same
    (`kept_output_and_grads`)."""
    expected, ref_grads = (output_and_grads(layer, x, keep, reference) if case is None
                           else kept_output_and_grads(case, layer, x, keep, reference))
    names = ["input", *(name for name, _ in layer.named_parameters())]
    for label, kernel in KERNELS.items():
        use_kernel(kernel)
        ours, our_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x, TokenMask(keep))[0])
        assert_matches(ours, our_grads, expected, ref_grads, keep, names, tolerance, label)


def assert_matches(ours, our_grads, expected, ref_grads, keep, names, tolerance, label):
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=tolerance, atol=tolerance,
                               msg=lambda m: f"{label}: {m}")
    # relative to the gradients' scale (entries reach ~25 in float32 here, and key.bias's true gradient is 0)
    scale = max(want.abs().max().item() for want in ref_grads)
    for name, got, want in zip(names, our_grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance * scale,
                                   msg=lambda m, name=name: f"{label}, {name}: {m}")


# (n, queries per block, lengths, window chunk bytes): one block holding every key (blocks tiling: no fused
# calls); blocks of 2r, the narrowest, and of 8, with a partial last block, fused calls on both sides and whole
# fused parts of pads; the near part computed one (batch, head, block) group per chunk
SHAPES = {
    "one block": (13, None, (13, 7, 1), None),
    "blocks of 2r": (37, 6, (37, 20, 1), None),
    "blocks of 8": (29, 8, (29, 11, 2), None),
    "one group per chunk": (29, 8, (29, 11, 2), 1),
}


@pytest.mark.parametrize("shape", slow_except(list(SHAPES), "one block"))
@pytest.mark.parametrize("out_of_window", slow_except(["clip", "zero"], "clip"))
@pytest.mark.parametrize("terms", slow_except(list(TERMS), "composite+key"))
def test_composite_float32_outputs_and_all_gradients_match_loop_reference(terms, out_of_window, shape, monkeypatch,
                                                                           use_kernel):
    # reach 3: most pairs lie outside the band; a short row makes whole parts pad
    n, size, lengths, chunk_bytes = SHAPES[shape]
    if size is not None:
        monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: size)
    if chunk_bytes is not None:
        monkeypatch.setattr(decomposition, "WINDOW_CHUNK_BYTES", chunk_bytes)
    layer = make_layer(TERMS[terms], out_of_window, value_depthwise_conv=True)
    x, keep = batch(lengths, n, torch.float32)
    assert_every_kernel_matches(layer, x, keep, partial(composite_attention_loops, layer), 1e-5, use_kernel,
                                case=(terms, out_of_window, n, lengths))


@pytest.mark.parametrize("n", [1, 2, 4, 5, 9, 14])
@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
def test_sequences_shorter_than_the_band_match_reference(n, out_of_window, monkeypatch, use_kernel):
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 2 * reach)
    layer = make_layer(TERMS["composite+key"], out_of_window, reach=3, dtype=torch.float64)
    x, keep = batch((n, max(1, n // 2)), n, torch.float64)
    assert_every_kernel_matches(layer, x, keep, partial(composite_attention_loops, layer), 1e-9, use_kernel)


@pytest.mark.parametrize("out_of_window", slow_except(["clip", "zero"], "zero"))
@pytest.mark.parametrize("terms", slow_except(list(TERMS), "composite+key"))
def test_convbert_heads_outputs_and_all_gradients_match_loop_reference(terms, out_of_window, monkeypatch, use_kernel):
    """ConvBERT's self-attention heads run the same engine: float64, odd n, padding, batch 3, blocks of 2r."""
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 2 * reach)
    layer = make_convbert_layer(TERMS[terms], out_of_window, dtype=torch.float64)
    x, keep = batch((15, 8, 1), 15, torch.float64)
    assert any(name.startswith("relative.") for name, _ in layer.named_parameters())
    assert_every_kernel_matches(layer, x, keep, partial(mixed_attention_loops, layer, masked=True), 1e-9, use_kernel)


@pytest.mark.parametrize(("n", "reach", "size"), [(601, 8, 256), (2048, 8, 256), (512, 8, 256), (257, 8, 16),
                                                  (100, 3, 6), (37, 4, 8), (16, 8, 16)])
def test_blocks_tiling_covers_every_score_once(monkeypatch, n, reach, size):
    # each (query, key) in exactly one place: its block's window or one fused call of the right side, and
    # every call's keys off the band for all its queries
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: size)
    tiles = decomposition.Tiling(n, reach, "blocks")
    count = torch.zeros(n, n, dtype=torch.long)
    for block in range(tiles.count):
        count[block * size:(block + 1) * size, max(block * size - reach, 0):(block + 1) * size + reach] += 1
    offset = torch.arange(n)[None, :] - torch.arange(n)[:, None]  # j - i
    for call in tiles.fused_calls():
        assert not call.causal and call.keys.start < call.keys.stop
        seen = offset[call.queries, call.keys]
        assert (seen < -reach).all() if call.side == "left" else (seen > reach).all()
        count[call.queries, call.keys] += 1
    assert (count == 1).all()


@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
def test_default_blocks_match_the_dense_bias(out_of_window):
    # the shipped block size over several blocks, a partial last one and whole pad blocks, against the
    # dense-bias path (itself checked against the loop reference), whose cost grows as n^2 only
    n, reach = 601, 8
    assert decomposition.block_size(n, reach, "blocks") < n // 2
    layer = make_layer(TERMS["composite+key"], out_of_window, reach=reach, dtype=torch.float64)
    x, keep = batch((n, 260, 3), n, torch.float64)
    assert dispatch.relative_path(layer.query(x).view(3, n, 4, 8).transpose(1, 2), "sdpa", 0.0, False) == "decomposed"
    ours, our_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x, TokenMask(keep))[0])
    layer.config._attn_implementation = "eager"
    expected, dense_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x, TokenMask(keep))[0])
    real = keep[..., None].expand_as(ours)
    torch.testing.assert_close(ours[real], expected[real], rtol=1e-10, atol=1e-10)
    for got, want in zip(our_grads, dense_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------- dropout


@pytest.mark.parametrize("layer_kind", slow_except(["composite", "convbert"], "composite"))
@pytest.mark.parametrize("kernel", ["math, causal", "math, blocks"])
def test_backward_replays_the_forward_dropout_masks(kernel, layer_kind, monkeypatch, use_kernel):
    """Dropout in the near part (its mask kept) and in the kernels (their seeds replayed), float64."""
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 8)
    use_kernel(KERNELS[kernel])
    make = make_layer if layer_kind == "composite" else make_convbert_layer
    layer = make(TERMS["composite+key"], "clip", dtype=torch.float64)
    x, keep = batch((21, 12), 21, torch.float64)
    analytic, numeric, dropped = directional_derivatives(layer, x, keep, 0.3)
    assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-8)
    _, _, undropped = directional_derivatives(layer, x, keep, 0.0)
    assert dropped != pytest.approx(undropped, rel=1e-3)  # the masks did drop probabilities


# ---------------------------------------------------------------- never the n x n bias


class LargestShapes(TorchDispatchMode):
    """Records the shape of every tensor an operator returns."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("make", [make_layer, make_convbert_layer])
def test_relative_heads_never_build_an_n_by_n_tensor_on_cpu(make, monkeypatch):
    """From 256 tokens on, without attention dropout, in training mode, with the shipped thresholds."""
    def dense(*args, **kwargs):
        raise AssertionError("the n x n bias was built")

    for builder in ("forward", "bias"):
        monkeypatch.setattr(RelativePositionBias, builder, dense)
    monkeypatch.setattr(dispatch, "attend", dense)
    layer = make(TERMS["composite+key"], reach=8)
    for n in (dispatch.CPU_DECOMPOSED_MIN_LENGTH, 600):
        x, keep = batch((n, n // 3), n, torch.float32)
        with LargestShapes() as recorded:
            layer(x, TokenMask(keep))[0].sum().backward()
        if n > 2 * decomposition.block_size(n, 8, "blocks"):  # windows are S x (S + 2r), S = 256
            assert not [shape for shape in recorded.shapes if sum(size >= n for size in shape) >= 2]


# ---------------------------------------------------------------- the custom operator torch.compile takes


def operator_arguments(terms: str, out_of_window: str, padded: bool, tiling: str) -> tuple:
    """The operator's arguments for a batch of 2 x 4 heads of 16 channels, n = 37, reach 3, leaves that need
    gradients (the relative pieces detached from the tables that made them); terms ending in "+alibi" add ALiBi,
    whose key constants take no gradient and ride on the CPU kernel's key mask."""
    torch.manual_seed(0)
    alibi = terms.endswith("+alibi")
    relative = RelativePositionBias(TERMS[terms.removesuffix("+alibi")], 4, 16, 3, out_of_window, alibi=alibi)
    q, k, v = (torch.randn(2, 4, 37, 16) for _ in range(3))
    pieces = relative.pieces(q, k)
    names = ["band", "row_left", "row_right", "key_left", "key_right"]
    tensors = [q, k, v, *(None if pieces[name] is None else pieces[name].contiguous() for name in names)]
    keep = torch.arange(37)[None] < torch.tensor([37, 20])[:, None] if padded else None
    # ALiBi's key constants take no gradient (the operator gives them none)
    constant = {6, 7} if alibi and pieces["key_constants"] else set()
    leaves = [None if t is None else t.detach().clone().requires_grad_(index not in constant)
              for index, t in enumerate(tensors)]
    return (*leaves, keep, 3, 0.0, tiling, pieces["key_constants"])


OPERATOR_CASES = [("composite+key", "clip", True, "blocks"), ("composite", "zero", False, "blocks"),
                  ("fixed", "clip", True, "causal")]
# ALiBi's key constants on the key mask: the same schema and registrations, so the operator's outputs and gradients
# against the autograd function's suffice
ALIBI_OPERATOR_CASE = ("composite+alibi", "clip", True, "blocks")


@pytest.mark.parametrize(("terms", "out_of_window", "padded", "tiling"), OPERATOR_CASES)
@pytest.mark.slow
def test_the_compile_operator_passes_torch_opcheck(terms, out_of_window, padded, tiling, monkeypatch):
    """Schema, fake version (the same code on fake tensors), autograd registration, AOT dispatch."""
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 8)  # fused calls in levels
    torch.library.opcheck(decomposition._relative_attention_op,
                          operator_arguments(terms, out_of_window, padded, tiling))


@pytest.mark.parametrize(("terms", "out_of_window", "padded", "tiling"), [*OPERATOR_CASES, ALIBI_OPERATOR_CASE])
def test_the_compile_operator_computes_what_the_autograd_function_does(terms, out_of_window, padded, tiling,
                                                                       monkeypatch):
    """Output and every input's gradient, the operator's backward rebuilding from its saved outputs what the
    function keeps on its context."""
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 8)
    arguments = operator_arguments(terms, out_of_window, padded, tiling)
    leaves = [t for t in arguments[:8] if t is not None and t.requires_grad]
    weights = torch.randn(2, 4, 37, 16, generator=torch.Generator().manual_seed(1))

    def run(attend):
        out = attend(*arguments)
        return [out, *torch.autograd.grad((out * weights).sum(), leaves)]

    operator = run(lambda *args: decomposition._relative_attention_op(*args)[0])
    function = run(lambda *args: decomposition.DecomposedRelativeAttention.apply(*args[:-2], CPU_FLASH, *args[-2:]))
    for got, want in zip(operator, function, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# ---------------------------------------------------------------- reduced precision


@pytest.mark.parametrize("tiling", ["blocks", "causal"])
@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
def test_bfloat16_follows_float32(out_of_window, tiling, monkeypatch):
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 8)  # fused calls on both sides
    torch.manual_seed(0)
    relative = RelativePositionBias(TERMS["composite+key"], 4, 16, 3, out_of_window)
    q, k, v = (torch.randn(2, 4, 37, 16) for _ in range(3))
    keep = torch.arange(37)[None] < torch.tensor([37, 20])[:, None]

    def run(dtype):
        tensors = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = decomposed_relative_attention(*tensors, relative.to(dtype).pieces(*tensors[:2]), keep, 3, 0.0,
                                            CPU_FLASH, tiling)
        out.float().pow(2).sum().backward()
        return [out.float(), *(t.grad.float() for t in tensors)]

    for got, want in zip(run(torch.bfloat16), run(torch.float32), strict=True):
        torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)


# ---------------------------------------------------------------- CUDA


class EmulatedCudaOps:
    """torch's CUDA attention ops as kernels.CudaFlashKernel calls them, computed by MathKernel on CPU: the
    same signatures and output layouts (the memory-efficient kernel's log-sum-exp padded to 32 rows, random
    state as tensors), checking the operands they get (heads padded to a multiple of 8, contiguous)."""

    math = MathKernel()

    @staticmethod
    def _check(*tensors):
        for t in tensors:
            assert t.shape[-1] % 8 == 0 and t.is_contiguous()

    def _scaled_dot_product_flash_attention(self, q, k, v, dropout_p, is_causal, return_debug_mask, *, scale):
        self._check(q, k, v)
        out, lse, seed = self.math.forward(q, k, v, key_mask=None, causal=is_causal, dropout_p=dropout_p, scale=scale)
        return out, lse, None, None, q.shape[-2], k.shape[-2], torch.tensor(seed), torch.tensor(0), None

    def _scaled_dot_product_flash_attention_backward(self, grad_out, q, k, v, out, lse, cum_q, cum_k, max_q, max_k,
                                                     dropout_p, is_causal, seed, offset, *, scale):
        self._check(grad_out, q, k, v, out)
        assert (max_q, max_k) == (q.shape[-2], k.shape[-2]) and lse.shape == q.shape[:-1]
        return self.math.backward(grad_out, q, k, v, out, lse, int(seed), key_mask=None, causal=is_causal,
                                  dropout_p=dropout_p, scale=scale)

    def _scaled_dot_product_efficient_attention(self, q, k, v, bias, compute_log_sumexp, dropout_p, is_causal, *,
                                                scale):
        self._check(q, k, v)
        assert bias is None and compute_log_sumexp
        out, lse, seed = self.math.forward(q, k, v, key_mask=None, causal=is_causal, dropout_p=dropout_p, scale=scale)
        padded = torch.nn.functional.pad(lse, (0, -lse.shape[-1] % 32), value=float("inf"))
        return out, padded, torch.tensor(seed), torch.tensor(0)

    def _scaled_dot_product_efficient_attention_backward(self, grad_out, q, k, v, bias, out, lse, seed, offset,
                                                         dropout_p, grad_input_mask, is_causal, *, scale):
        self._check(grad_out, q, k, v, out)
        assert lse.shape[-1] % 32 == 0 and grad_input_mask == [True, True, True, False]
        grads = self.math.backward(grad_out, q, k, v, out, lse[..., :q.shape[-2]], int(seed), key_mask=None,
                                   causal=is_causal, dropout_p=dropout_p, scale=scale)
        return *grads, None


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_cuda_kernel_calls_on_emulated_ops(dtype, monkeypatch, use_kernel):
    """kernels.CudaFlashKernel on CPU with its torch ops emulated: the memory-efficient kernel's calls (float32 and
    float64) against the loop reference, and the flash kernel's (half precision) against them."""
    monkeypatch.setattr(kernels, "aten", EmulatedCudaOps())
    monkeypatch.setattr(decomposition, "block_size", lambda n, reach, tiling: 2 * reach)
    use_kernel(CUDA_FLASH)
    layer = make_layer(TERMS["composite+key"], "clip", dtype=torch.float64)
    x, keep = batch((21, 12, 1), 21, torch.float64)
    if dtype == torch.float64:
        expected, ref_grads = output_and_grads(layer, x, keep,
                                               lambda x, keep: composite_attention_loops(layer, x, keep))
        ours, our_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x, TokenMask(keep))[0])
        names = ["input", *(name for name, _ in layer.named_parameters())]
        assert_matches(ours, our_grads, expected, ref_grads, keep, names, 1e-9, "emulated efficient kernel")
        analytic, numeric, _ = directional_derivatives(layer, x, keep, 0.3)
        assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-8)
        return
    wide, wide_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x, TokenMask(keep))[0])
    layer.to(dtype)
    half, half_grads = output_and_grads(layer, x, keep, lambda x, keep: layer(x.to(dtype), TokenMask(keep))[0])
    real = keep[..., None].expand_as(wide)
    torch.testing.assert_close(half[real], wide[real], rtol=0.05, atol=0.05)
    scale = max(want.abs().max().item() for want in wide_grads)  # key.bias's true gradient is 0: rounding alone
    names = ["input", *(name for name, _ in layer.named_parameters())]
    for name, got, want in zip(names, half_grads, wide_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0.05, atol=0.02 * scale, msg=lambda m, name=name: f"{name}: {m}")


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernels need a CUDA GPU")


@cuda
# Seen on an H200 (benchmarks/results/gpu_session/tests_rerun.log): 4-5 % of the outputs off by up to 5.4, in the
# rows of the one-token sequence above all (cause not found); the fused Triton kernel (the CUDA default, compiled
# graphs included) passes the same reference. Strict: a fix turns this red until the mark goes.
@pytest.mark.xfail(strict=True, reason="the decomposition on CUDA is wrong in padded rows; cause not found yet")
@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
@pytest.mark.parametrize("terms", list(TERMS))
def test_cuda_float32_outputs_and_all_gradients_match_loop_reference(terms, out_of_window):
    """The decomposition on CUDA with the memory-efficient kernel (float32); compiled graphs take it there."""
    layer = make_layer(TERMS[terms], out_of_window, hidden_size=64, value_depthwise_conv=True)
    x, keep = batch((37, 20, 1), 37, torch.float32, width=64)
    expected, ref_grads = output_and_grads(layer, x, keep, lambda x, keep: composite_attention_loops(layer, x, keep))
    layer.cuda()
    q = torch.zeros(1, 4, 37, 16, device="cuda")
    assert dispatch.fused_kernel(q.device, q.dtype) is CUDA_FLASH
    with dispatch.forced_path("decomposed"):
        ours, our_grads = output_and_grads(layer, x, keep,
                                           lambda x, keep: layer(x.cuda(), TokenMask(keep.cuda()))[0].cpu())
    names = ["input", *(name for name, _ in layer.named_parameters())]
    assert_matches(ours, [g.cpu() for g in our_grads], expected, ref_grads, keep, names, 1e-5, "cuda")


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_half_precision_follows_float32(dtype):
    """The flash kernel (half precision) against the memory-efficient one (float32), heads of 64 plus the column."""
    torch.manual_seed(0)
    relative = RelativePositionBias(TERMS["composite+key"], 4, 64, 8, "clip").cuda()
    q, k, v = (torch.randn(2, 4, 301, 64, device="cuda") for _ in range(3))
    keep = (torch.arange(301)[None] < torch.tensor([301, 150])[:, None]).cuda()

    def run(dtype):
        tensors = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = decomposed_relative_attention(*tensors, relative.to(dtype).pieces(*tensors[:2]), keep, 8, 0.0,
                                            CUDA_FLASH)
        (out.float().pow(2) * keep[:, None, :, None]).sum().backward()
        return [out.float() * keep[:, None, :, None], *(t.grad.float() for t in tensors)]

    for got, want in zip(run(dtype), run(torch.float32), strict=True):
        torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)


@cuda
def test_cuda_backward_replays_the_forward_dropout_masks():
    """float32 (the memory-efficient kernel's Philox state), so the central difference is coarse."""
    layer = make_layer(TERMS["composite+key"], "clip", hidden_size=64).cuda()
    x, keep = batch((45, 20), 45, torch.float32, width=64)
    x, keep = x.detach().cuda().requires_grad_(), keep.cuda()
    with dispatch.forced_path("decomposed"):
        analytic, numeric, _ = directional_derivatives(layer, x, keep, 0.3, eps=1e-3)
    # float32 on an H200: eps 1e-2 left 6 % (the central difference's own error, as without dropout: 4.5 %), 1e-3
    # 0.08 % (benchmarks/results/gpu_session/dropout_diag.txt)
    assert analytic == pytest.approx(numeric, rel=1e-2)
