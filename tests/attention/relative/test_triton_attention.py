"""The fused Triton kernel (attention/relative/triton/, entered by triton_attention.py) against a float64 reference
that builds every score from the papers' formulas one query row at a time. On CPU the kernel runs under
Triton's interpreter (tests/conftest.py); on a GPU the same tests run compiled, the half-precision ones too."""

from __future__ import annotations

import math
from itertools import pairwise
from typing import ClassVar

import pytest
import torch
from helpers.relative import TERMS, batch, make_convbert_layer, make_layer
from helpers.tiers import slow_except
from helpers.tiny import assert_same_step, checkpoint_activations, randomize_, step_of, tiny_config
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from convattn import ConvAttnModel
from convattn.attention import PackedSequences, TokenMask
from convattn.attention.relative import bias, dispatch
from convattn.attention.relative.bias import RelativePositionBias

pytest.importorskip("triton")
from convattn.attention.relative import triton_attention
from convattn.attention.relative.triton import launch, operator
from convattn.attention.relative.triton_attention import triton_relative_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# compiling every variant for the GPU costs minutes: there the CPU interpreter's wider sweep is not repeated
interpreter_only = pytest.mark.skipif(DEVICE == "cuda", reason="covered under the interpreter; GPU compile time")


def relative_columns(table, offsets, reach: int, clip: bool):
    """table[..., c(t)] for each offset t of `offsets` (the last axis: one per key), c(t) = clamp(t, -r, r) + r, and
    zero where |t| > r in zero mode: `relative_term` for a row of offsets."""
    columns = table[..., offsets.clamp(-reach, reach) + reach]
    return columns if clip else columns * (offsets.abs() <= reach)


def reference_scores(q, k, rel: RelativePositionBias | None):
    """(batch, heads, n, n) float64 scores, one query row i at a time: every key j's relative terms read from the
    tables' columns for j - i (i - j for the key table), and ALiBi's -m_h |i - j| (i, j the rows: positions within
    the sequence) where rel has it."""
    q, k = q.double(), k.double()
    n, d = q.shape[-2], q.shape[-1]
    scores = q @ k.mT / math.sqrt(d)
    if rel is None:
        return scores
    keys = torch.arange(n, device=q.device)
    rows = []
    for i in range(n):
        offset = keys - i  # j - i for every key j
        term = torch.zeros(*q.shape[:2], n, dtype=torch.float64, device=q.device)
        if rel.fixed is not None:  # (heads, n)
            term = term + relative_columns(rel.fixed.double(), offset, rel.reach, rel.clip)
        if rel.query_kernel is not None:  # q_i . W[:, c(j - i)]
            term = term + q[..., i, :] @ relative_columns(rel.query_kernel.double(), offset, rel.reach,
                                                          rel.clip) / math.sqrt(d)
        if rel.key_kernel is not None:  # k_j . U[:, c(i - j)]
            u = relative_columns(rel.key_kernel.double(), -offset, rel.reach, rel.clip)  # (d, n)
            term = term + (k * u.mT).sum(-1) / math.sqrt(d)
        if rel.alibi is not None:
            slopes = torch.tensor(rel.alibi, dtype=torch.float64, device=q.device)
            term = term - slopes[:, None] * offset.abs()
        rows.append(term)
    return scores + torch.stack(rows, -2)


def reference_attention(q, k, v, rel, keep=None, dropped=None, dropout_p=0.0):
    """softmax over real keys, times the dropout mask / (1 - p) where one is given, times v; float64. A row without
    a real key attends to nothing (zero, as SDPA gives a fully masked row)."""
    scores = reference_scores(q, k, rel)
    if keep is not None:
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    probs = scores.softmax(-1)
    if keep is not None:
        probs = torch.where(keep.any(-1)[:, None, None, None], probs, 0.0)
    if dropped is not None:
        probs = probs * ~dropped / (1 - dropout_p)
    return probs @ v.double()


@pytest.fixture(params=["split", pytest.param("atomic", marks=pytest.mark.slow)])
def dq_design(request, monkeypatch):
    """Both of the backward's dQ designs (launch.DQ_DESIGNS): split accumulators, and atomic adds into one (in the
    slow tier; the fast tier's atomic case is test_the_atomic_design_adds_every_key_block...)."""
    monkeypatch.setenv(launch.DQ_ENVIRONMENT, request.param)
    return request.param


def make_relative(terms, out_of_window, heads, head_dim, reach, seed=0, alibi=False):
    """Random tables on DEVICE, float64 (the kernel's calls cast them); ALiBi's slopes with `alibi`."""
    rel = RelativePositionBias(terms, heads, head_dim, reach, out_of_window, alibi=alibi)
    randomize_(rel, seed)
    return rel.to(DEVICE, torch.float64)


def operands(batch, heads, n, head_dim, seed=0):
    """q, k, v on DEVICE in float64: the reference's inputs, which the kernel's calls cast."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, head_dim, generator=generator, dtype=torch.float64).to(DEVICE)
            for _ in range(3)]


def kernel_attention(q, k, v, rel, dtype=torch.float32, given_tables=False, **kwargs):
    """The kernel in `dtype` with `rel`'s terms as a layer sends them (dispatch.kernel_inputs: W and U projected
    inside the kernel's launches, fixed alone a broadcast table, ALiBi as its slopes), or with given_tables, both
    tables built by `rel` in that dtype outside the kernel; the output back in float64."""
    q, k, v = (x.to(dtype) for x in (q, k, v))
    if rel is None:
        return triton_relative_attention(q, k, v, None, None, reach=0, clip=True, **kwargs).double()
    if not given_tables:
        return triton_relative_attention(q, k, v, **dispatch.kernel_inputs(rel, q, k), **kwargs).double()
    row_table, key_table = (None if t is None else t.to(dtype) for t in rel.tables(q, k))
    reach = rel.reach if row_table is not None or key_table is not None else 0
    out = triton_relative_attention(q, k, v, row_table, key_table, reach=reach, clip=rel.clip,
                                    alibi_slopes=rel.slopes(q), **kwargs)
    return out.double()


@pytest.fixture(params=[False, pytest.param(True, marks=[pytest.mark.slow, interpreter_only])],
                ids=["projected", "given"])
def given_tables(request):
    """The tables projected inside the kernel's launches from q, k and the terms' parameters (what a layer sends),
    and, in the slow tier under the interpreter, built outside it and given (what rotary's unrotated terms send; on
    a GPU the tests that call the operators with tables run them)."""
    return request.param


def relative_error(ours, expected):
    """||ours - expected|| / ||expected||, against an absolute floor where the expected value is zero (n = 1: q's
    gradient through a softmax over one key; unit-scale inputs)."""
    return ((ours - expected).norm() / expected.norm().clamp_min(1.0)).item()


def check_against_reference(terms, out_of_window, batch, heads, n, head_dim, reach, lengths=None, dtype=torch.float32,
                            tolerance=1e-4, keep=None, alibi=False, given_tables=False):
    """Output and the gradients of q, k, v and every table parameter, kernel against reference; the key mask right
    padding to `lengths`, or `keep`; ALiBi's term with `alibi`; the tables given (kernel_attention)."""
    rel = make_relative(terms, out_of_window, heads, head_dim, reach, alibi=alibi) if terms or alibi else None
    q, k, v = (x.requires_grad_() for x in operands(batch, heads, n, head_dim))
    if lengths is not None:
        keep = (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]).to(DEVICE)
    ours = kernel_attention(q, k, v, rel, dtype, given_tables, keep=keep)
    assert_matches(ours, reference_attention(q, k, v, rel, keep), q, k, v, rel, tolerance)


def assert_matches(ours, expected, q, k, v, rel, tolerance=1e-4):
    """The kernel's output and the gradients of a weighted sum of it with respect to q, k, v and every table
    parameter, against the reference's."""
    assert relative_error(ours, expected) < tolerance
    weights = torch.randn(ours.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(DEVICE)
    named = [("q", q), ("k", k), ("v", v), *(rel.named_parameters() if rel is not None else [])]
    inputs = [x for _, x in named]
    for (name, _), g, e in zip(named, torch.autograd.grad((ours * weights).sum(), inputs),
                               torch.autograd.grad((expected * weights).sum(), inputs), strict=True):
        assert relative_error(g.double(), e) < tolerance, name


# the cases a GPU runs too, the others skipped there by their marks (so that a GPU's selection can be read from them,
# benchmarks/cuda_selection.py); in the fast tier, one case (tests/helpers/tiers.py)
ON_GPU_TOO = {("composite", "clip"), ("composite+key", "zero")}
FAST = ("composite+key", "clip")


@pytest.mark.parametrize("terms, out_of_window", [
    pytest.param(terms, out_of_window, marks=[*(() if (terms, out_of_window) in ON_GPU_TOO else [interpreter_only]),
                                              *(() if (terms, out_of_window) == FAST else [pytest.mark.slow])])
    for terms in TERMS for out_of_window in ("clip", "zero")])
def test_every_term_combination_matches_the_reference_with_padding(terms, out_of_window, dq_design, given_tables):
    # odd n, no multiple of any block size, batch 2 with one row padded, 32-channel heads
    check_against_reference(TERMS[terms], out_of_window, batch=2, heads=2, n=37, head_dim=32, reach=3,
                            lengths=[37, 29], given_tables=given_tables)


@interpreter_only
@pytest.mark.parametrize("n, reach, head_dim", slow_except([(1, 8, 64), (5, 8, 64), (8, 8, 64), (40, 2, 64),
                                                            (19, 4, 128), (23, 3, 48)], (5, 8, 64), (19, 4, 128)))
def test_short_sequences_and_other_head_sizes(n, reach, head_dim, dq_design):
    """n <= r (every pair on the band), n = 1, and heads of 64, 128 and 48 (not a power of two) channels."""
    check_against_reference(TERMS["composite+key"], "clip", batch=2, heads=1, n=n, head_dim=head_dim, reach=reach,
                            lengths=[n, max(1, n - 3)])


@pytest.mark.parametrize("terms", ["composite", pytest.param("composite+key", marks=interpreter_only)])
@pytest.mark.slow
def test_padding_anywhere_and_keys_past_the_last_real_one(terms, dq_design):
    """The kernels skip the keys past a sequence's last real one and mask pads by position, reading the key mask only
    where pads come before real keys: left padding, pads scattered among real keys, right padding that leaves whole
    key tiles (32 keys under the interpreter) of pads, no padding, and no real key at all."""
    n = 75
    position = torch.arange(n)
    keep = torch.stack([position >= 20, (position % 7 != 3) & (position < 61), position < 20,
                        torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)]).to(DEVICE)
    # one head: the key mask is per sequence, and the other tests here take several heads through the same code
    check_against_reference(TERMS[terms], "clip", batch=5, heads=1, n=n, head_dim=32, reach=3, keep=keep)


@interpreter_only
@pytest.mark.parametrize("terms", ["fixed", "key", "composite+key"])
@pytest.mark.parametrize("out_of_window", ["clip", "zero"])
@pytest.mark.slow
def test_table_gradients_are_written_whole(terms, out_of_window, monkeypatch, dq_design, given_tables):
    """The kernels write every entry of a table's gradient, those without a partner key or query too (the ends of a
    sequence, pad keys, a row without real keys), so its buffer is not zero-filled first: here it starts as NaN.
    A broadcast table ("fixed": one row for the batch) and per-sequence ones, padded and packed; projected tables
    read their gradient's rows back whole for q's and k's share (a NaN left would reach them)."""
    allocate = launch.table_gradient
    monkeypatch.setattr(launch, "table_gradient", lambda *args: allocate(*args).fill_(float("nan")))
    n = 40
    position = torch.arange(n)
    keep = torch.stack([position >= 9, (position % 7 != 3) & (position < 33), torch.zeros(n, dtype=torch.bool)])
    check_against_reference(TERMS[terms], out_of_window, batch=3, heads=2, n=n, head_dim=32, reach=5,
                            keep=keep.to(DEVICE), given_tables=given_tables)
    check_against_reference(TERMS[terms], out_of_window, batch=2, heads=1, n=4, head_dim=32, reach=6, lengths=[4, 2],
                            given_tables=given_tables)


@interpreter_only
@pytest.mark.slow
def test_large_table_values_leave_no_nan_from_rows_past_the_sequence(dq_design):
    """Key-table terms of +-160 (a diverging run's, say) overflow exp in float32 where nothing normalises them: the
    rows of a last query tile past n, which the key kernel sums over. They must get no probability there, not
    inf * 0 = NaN in dK, dV and the key table's gradient (as they did)."""
    rel = make_relative(TERMS["composite+key"], "clip", 2, 32, reach=3)
    with torch.no_grad():
        rel.key_kernel.mul_(150.0)
    q, k, v = (x.requires_grad_() for x in operands(2, 2, 75, 32))
    keep = (torch.arange(75)[None, :] < torch.tensor([75, 60])[:, None]).to(DEVICE)
    assert rel.tables(q, k)[1].abs().max() > 100
    assert_matches(kernel_attention(q, k, v, rel, keep=keep), reference_attention(q, k, v, rel, keep), q, k, v, rel)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_projected_tables_equal_torchs_products_laid_out_as_their_operands(packed):
    """relative_tables: fixed + q W / sqrt(d) and k U / sqrt(d) in one launch, against torch's products in float64,
    each table's rows in its operand's memory order (the heads inner where q is a (b, n, h, d) view), so that the
    parameters' gradients read both as matrices without a copy; an empty tensor for a table not asked for."""
    rel = make_relative(TERMS["composite+key"], "clip", heads=3, head_dim=32, reach=5)
    generator = torch.Generator().manual_seed(0)
    if packed:
        q, k = (torch.randn(41, 3, 32, generator=generator).to(DEVICE) for _ in range(2))
        as_rows = lambda x: x.transpose(0, 1)[None]  # noqa: E731 (total, heads, d) -> (1, heads, total, d)
    else:
        q, k = (torch.randn(2, 41, 3, 32, generator=generator).to(DEVICE).transpose(1, 2) for _ in range(2))
        as_rows = lambda x: x  # noqa: E731
    row, key = operator.relative_tables(q, k, rel.fixed.float(), rel.query_kernel.float(), rel.key_kernel.float())
    expected_row, expected_key = (t[0].transpose(0, 1) if packed else t
                                  for t in rel.tables(as_rows(q).double(), as_rows(k).double()))
    for ours, expected, operand in ((row, expected_row, q), (key, expected_key, k)):
        assert ours.dtype == torch.float32 and ours.shape == expected.shape
        assert relative_error(ours.double(), expected) < 1e-6
        assert launch.memory_order(ours) == launch.memory_order(operand)
    row, key = operator.relative_tables(q, k, None, None, rel.key_kernel.float())
    assert row.numel() == 0 and relative_error(key.double(), expected_key) < 1e-6


def test_a_layer_sends_the_kernel_its_terms_parameters_and_few_operators_besides():
    """A layer's terms that read q or k reach the kernel as their parameters (dispatch.kernel_inputs), the tables
    projected in one launch and their share of dq and dk summed inside the backward's kernels: torch's operators
    around the kernels, forward and backward (fixed's gradient, W's and U's products and scales), are 3 for
    composite and 5 for composite+key, against 10 and 17 with the tables built outside and given (the control; in
    float32: half precision adds casts to both). Fixed terms alone, ALiBi alone and rotary's unrotated terms
    (tables_from) keep their tables. q, k, v are laid out as a layer's (views of (batch, n, heads, d)): neither the
    tables nor the parameters' gradients copy them."""
    q, k, v = (x.float().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
               for x in operands(2, 2, 19, 32))
    mask = TokenMask((torch.arange(19)[None, :] < torch.tensor([19, 12])[:, None]).to(DEVICE))
    assert mask.has_padding  # asked once, before counting
    grad_out = torch.ones_like(q)
    kernels = ["triton_relative_tables", "triton_relative_attention", "triton_relative_attention_backward"]
    for terms, expected in (("composite", (3, 10)), ("composite+key", (5, 17))):
        rel = make_relative(TERMS[terms], "clip", heads=2, head_dim=32, reach=3).float()

        def operators(tables_from=None) -> list[str]:
            with Dispatched() as counted:
                out = dispatch._triton(q, k, v, rel, mask, 0.0, tables_from)  # noqa: B023 (called at once)
                torch.autograd.grad(out, [q, k, v, *rel.parameters()], grad_out)  # noqa: B023
            return counted.names

        projected, given = operators(), operators((q, k))
        assert sorted(name for name in projected if name in kernels) == sorted(kernels)
        assert "triton_relative_tables" not in given
        assert (len([name for name in projected if name not in kernels]),
                len([name for name in given if name not in kernels])) == expected, terms
    inputs = dispatch.kernel_inputs(rel, q, k)
    assert inputs["query_kernel"] is rel.query_kernel and inputs["key_kernel"] is rel.key_kernel
    assert inputs["fixed"] is rel.fixed and inputs["row_table"] is None and inputs["key_table"] is None
    fixed_alone = dispatch.kernel_inputs(make_relative(["fixed"], "clip", 2, 32, reach=3), q, k)
    assert fixed_alone["row_table"].shape == (1, 2, 19, 7) and "query_kernel" not in fixed_alone
    alibi_alone = dispatch.kernel_inputs(make_relative([], "clip", 2, 32, reach=3, alibi=True), q, k)
    assert alibi_alone["row_table"] is None and alibi_alone["reach"] == 0


def test_packed_sequences_give_every_layer_one_int32_copy_of_their_offsets():
    """The kernel takes cu_seqlens in int32 and a batch's lengths sum to int64 offsets: the cast is made once per
    batch, not once per layer (a launch on a GPU, 12 a step at the papers' depth), and each layer gets it."""
    lengths = torch.tensor([7, 3, 9])
    mask = PackedSequences.from_lengths(lengths)
    assert mask.cu_seqlens.dtype == torch.int64
    rel = make_relative(TERMS["composite"], "clip", heads=2, head_dim=16, reach=2).float()
    query, key, value = (torch.randn(1, int(lengths.sum()), 32, device=DEVICE) for _ in range(3))
    calls = []
    for _ in range(2):
        with Dispatched() as counted:
            dispatch._triton_packed(query, key, value, 2, rel, mask, 0.0)
        calls.append([name for name in counted.names if name == "_to_copy"])
    assert calls[1] == [] and mask.offsets.dtype == torch.int32
    assert mask.offsets.tolist() == [0, 7, 10, 19]


class Dispatched(TorchDispatchMode):
    """What torch's operators did while it is active, the backward's too: `names`, the operators called (views and
    detaches left out: they launch nothing), and `shapes`, those of every tensor they returned."""
    VIEWS: ClassVar[set[str]] = {"view", "t", "transpose", "expand", "permute", "unsqueeze", "squeeze", "_unsafe_view",
                                 "detach", "alias", "select", "slice", "as_strided"}

    def __init__(self):
        super().__init__()
        self.names, self.shapes = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in self.VIEWS:
            self.names.append(func.overloadpacket.__name__)
        out = func(*args, **(kwargs or {}))
        self.shapes += [tuple(t.shape) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out


def test_fixed_terms_alone_beside_a_projected_key_table_match_the_reference():
    """Fixed terms without W are a broadcast row table given as it is, beside the key table projected from k: one call
    takes both kinds (padding, odd n)."""
    check_against_reference(["fixed", "dynamic_key"], "clip", batch=2, heads=2, n=21, head_dim=32, reach=3,
                            lengths=[21, 15])


def test_projected_terms_are_refused_in_one_line_where_they_cannot_be_taken():
    q = torch.zeros(1, 2, 8, 16, device=DEVICE)
    w, fixed = torch.zeros(16, 5, device=DEVICE), torch.zeros(2, 5, device=DEVICE)
    with pytest.raises(ValueError, match="fixed is projected with query_kernel only"):
        triton_relative_attention(q, q, q, None, None, reach=2, clip=True, fixed=fixed, key_kernel=w)
    with pytest.raises(ValueError, match="row_table and the kernel that projects it are exclusive"):
        triton_relative_attention(q, q, q, q[..., :5], None, reach=2, clip=True, query_kernel=w)
    with pytest.raises(ValueError, match="key_table and the kernel that projects it are exclusive"):
        triton_relative_attention(q, q, q, None, q[..., :5], reach=2, clip=True, key_kernel=w)
    with pytest.raises(ValueError, match=r"query_kernel must be \(16, 7\) \(heads 2, head size 16, reach 3\); got "
                                         r"\(16, 5\)"):
        triton_relative_attention(q, q, q, None, None, reach=3, clip=True, query_kernel=w)
    with pytest.raises(ValueError, match=r"fixed must be \(2, 5\)"):
        triton_relative_attention(q, q, q, None, None, reach=2, clip=True, query_kernel=w, fixed=fixed[:1])


@interpreter_only
def test_plain_attention_without_terms(dq_design):
    check_against_reference([], "clip", batch=2, heads=2, n=23, head_dim=32, reach=0, lengths=[23, 11])


def padding_anywhere(n):
    """Key masks of five rows: left padding, pads scattered among real keys, right padding that leaves whole key tiles
    (32 keys under the interpreter) of pads, no padding, and no real key at all."""
    position = torch.arange(n)
    return torch.stack([position >= 20, (position % 7 != 3) & (position < 61), position < 20,
                        torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)]).to(DEVICE)


# ALiBi alone, and with composite attention's terms (clip mode, which ALiBi's configs require)
ALIBI_TERMS = {"alibi": [], "composite+alibi": TERMS["composite"], "composite+key+alibi": TERMS["composite+key"]}


# slow tier: the reference's pair-by-pair tables take the time; the fast tier has the kernel with ALiBi and terms
# against the loop reference in test_positions_paths, and ALiBi alone in the no-table test below. The split dQ
# design only: ALiBi changes the scores, not how dQ is summed (the atomic design's cases are the terms' above)
@pytest.mark.slow
@pytest.mark.parametrize("terms", list(ALIBI_TERMS))
def test_alibi_matches_the_reference_with_padding_anywhere(terms):
    """ALiBi computed inside the kernels, in the forward and the backward's recomputed scores: three heads (slopes
    2^-4, 2^-8 and 2^-2: not a power of two), odd n over several query and key tiles, so that tiles left of the band,
    on it and right of it all carry the term, and every padding the kernels tell apart."""
    n = 75
    check_against_reference(ALIBI_TERMS[terms], "clip", batch=5, heads=3, n=n, head_dim=32, reach=3,
                            keep=padding_anywhere(n), alibi=True)


def alibi_sized(shapes, lengths, width):
    """The shapes of `shapes` that an ALiBi bias or table would have: two axes of a sequence's length (n x n), or one
    and a last axis of `width` (n x (2r + 1))."""
    return [shape for shape in shapes if sum(size in lengths for size in shape) >= 2
            or (len(shape) >= 2 and shape[-1] == width and any(size in lengths for size in shape[:-1]))]


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_alibi_alone_reaches_the_kernel_as_slopes_without_a_table(packed, monkeypatch):
    """A layer with ALiBi alone calls the kernel with no table, reach 0 and the heads' slopes; nothing on its path
    builds ALiBi's tables or bias, and no tensor of n x n or n x (2r + 1) entries is allocated, forward or backward.
    Control: the decomposition, which carries ALiBi in tables, allocates some that the check finds."""
    layer = make_layer([], hidden_size=64, position_embedding_type="alibi").to(DEVICE)
    width = 2 * layer.relative.reach + 1  # the tables' width where ALiBi rides on them
    layer.config._attn_implementation = "convattn_triton"
    x, keep = (t.to(DEVICE) for t in batch((19, 12), 19, torch.float32, width=64))
    lengths = {19, 12, 31}  # the padded length, a sequence's, the packed stream's

    def run():
        with Dispatched() as allocations:
            if packed:
                out = layer(x[keep][None], PackedSequences.from_lengths(keep.sum(1)))[0]
            else:
                out = layer(x, TokenMask(keep))[0]
            out.pow(2).sum().backward()
        return allocations.shapes

    if not packed:
        with dispatch.forced_path("decomposed"):
            assert alibi_sized(run(), lengths, width)
    calls = []
    forward = operator.run_forward
    monkeypatch.setattr(operator, "run_forward", lambda *args: calls.append(args) or forward(*args))
    for name in ("alibi_table", "alibi_bias", "pieces", "forward"):
        monkeypatch.setattr(RelativePositionBias, name, lambda *args, name=name: pytest.fail(f"{name} was called"))
    assert alibi_sized(run(), lengths, width) == []
    [call] = calls
    row_table, key_table, reach, slopes = call[3], call[4], call[9], call[13]
    assert row_table is None and key_table is None and reach == 0
    assert slopes.dtype == torch.float32 and slopes.tolist() == list(layer.relative.alibi)


def test_alibi_slopes_are_made_once_and_train_after_inference_mode(monkeypatch):
    """The slopes tensor is made once per device and dtype, and never as an inference tensor: a layer first run under
    torch.inference_mode trains afterwards (the kernel's backward saves the slopes)."""
    monkeypatch.setattr(bias, "_SLOPES", {})
    layer = make_layer([], hidden_size=64, position_embedding_type="alibi").to(DEVICE)
    layer.config._attn_implementation = "convattn_triton"
    x, keep = batch((19, 12), 19, torch.float32, width=64)
    x, keep = x.detach().to(DEVICE).requires_grad_(), keep.to(DEVICE)
    with torch.inference_mode():
        layer(x.detach(), TokenMask(keep))
    [made] = bias._SLOPES.values()
    assert not made.is_inference()
    layer(x, TokenMask(keep))[0].pow(2).sum().backward()
    [kept] = bias._SLOPES.values()
    assert x.grad.abs().sum() > 0 and kept is made


@pytest.mark.parametrize("terms", slow_except(["composite+key", "alibi", "composite+key+alibi"], "alibi"))
def test_packed_variable_lengths_equal_each_sequence_alone(terms, dq_design, given_tables):
    """Packed sequences (cu_seqlens) against each sequence alone: the tables per token (projected inside the kernel's
    launches, or given), and ALiBi's positions the offsets from each sequence's start (three heads; one sequence
    over several tiles)."""
    lengths, heads, head_dim = [7, 1, 40, 16], 3, 32
    rel = make_relative(ALIBI_TERMS.get(terms, TERMS.get(terms)), "clip", heads, head_dim, reach=3,
                        alibi=terms in ALIBI_TERMS)
    sequences = [operands(1, heads, n, head_dim, seed=s) for s, n in enumerate(lengths)]
    # packed (total, heads, d): each sequence's (1, heads, n, d) laid end to end
    q, k, v = (torch.cat([seq[t][0].transpose(0, 1) for seq in sequences]).requires_grad_() for t in range(3))
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    qd, kd, vd = (x.float() for x in (q, k, v))
    if given_tables:
        # tables of the packed tokens: (1, heads, total, 2r + 1) -> (total, heads, 2r + 1)
        row_table, key_table = (None if t is None else t[0].transpose(0, 1).float()
                                for t in rel.tables(qd.transpose(0, 1)[None], kd.transpose(0, 1)[None]))
        reach = rel.reach if row_table is not None or key_table is not None else 0
        terms = dict(row_table=row_table, key_table=key_table, reach=reach, clip=rel.clip,
                     alibi_slopes=rel.slopes(qd))
    else:
        terms = dispatch.kernel_inputs(rel, qd, kd)
    packed = triton_relative_attention(qd, kd, vd, **terms, cu_seqlens=cu_seqlens.to(DEVICE),
                                       max_seqlen=max(lengths)).double()
    starts = cu_seqlens.tolist()
    expected = torch.cat([reference_attention(*(x[a:b].transpose(0, 1)[None] for x in (q, k, v)), rel)[0]
                          .transpose(0, 1) for a, b in pairwise(starts)])
    assert_matches(packed, expected, q, k, v, rel)


def dropped_probabilities(q, k, rel, keep, dropout_p, seed):
    """Which probabilities the kernel drops under torch seed `seed`: with v the identity, out = P * mask / (1 - p)."""
    batch, heads, n, head_dim = q.shape
    eye = torch.eye(n, head_dim, dtype=torch.float64, device=DEVICE).expand(batch, heads, n, head_dim)
    torch.manual_seed(seed)
    out = kernel_attention(q.detach(), k.detach(), eye, rel, keep=keep, dropout_p=dropout_p)
    return (out[..., :n] == 0) & keep[:, None, None, :]


@pytest.mark.slow
@pytest.mark.parametrize("alibi", [False, True], ids=["composite+key", "composite+key+alibi"])
def test_dropout_is_replayed_in_backward(alibi, dq_design):
    batch, heads, n, head_dim, dropout_p, seed = 2, 2, 21, 32, 0.3, 7
    rel = make_relative(TERMS["composite+key"], "clip", heads, head_dim, reach=3, alibi=alibi)
    q, k, v = (x.requires_grad_() for x in operands(batch, heads, n, head_dim))
    keep = (torch.arange(n)[None, :] < torch.tensor([n, 15])[:, None]).to(DEVICE)
    dropped = dropped_probabilities(q, k, rel, keep, dropout_p, seed)
    rate = dropped.sum() / (keep[:, None, None, :].expand_as(dropped).sum())
    assert abs(rate - dropout_p) < 0.05
    torch.manual_seed(seed)
    ours = kernel_attention(q, k, v, rel, keep=keep, dropout_p=dropout_p)
    expected = reference_attention(q, k, v, rel, keep, dropped, triton_attention.kernel_dropout_p(dropout_p))
    assert relative_error(ours, expected) < 1e-4
    weights = torch.randn(ours.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(DEVICE)
    inputs = [q, k, v, *rel.parameters()]
    expected_grads = torch.autograd.grad((expected * weights).sum(), inputs)
    for g, e in zip(torch.autograd.grad((ours * weights).sum(), inputs, retain_graph=True), expected_grads,
                    strict=True):
        assert relative_error(g.double(), e) < 1e-4
    # control: the kernels' backward drawing from another seed than its forward no longer gives v's gradient
    torch.manual_seed(seed)
    drawn = torch.randint(0, 2**30, (), device=DEVICE)  # the seed the call above drew first
    q32, k32, v32 = (x.detach().float() for x in (q, k, v))
    tables = [t.detach().float() for t in rel.tables(q32, k32)]
    options = (0, rel.reach, rel.clip, dropout_p, head_dim**-0.5, rel.slopes(q32))
    out, lse = operator.attention_forward(q32, k32, v32, *tables, keep.view(torch.uint8), None, drawn, *options)
    for replayed, matches in ((drawn, True), (drawn + 1, False)):
        grad_v = operator.attention_backward(weights.float(), q32, k32, v32, out, lse, *tables, keep.view(torch.uint8),
                                            None, replayed, *options)[2]
        assert (relative_error(grad_v.double(), expected_grads[2]) < 1e-4) == matches


@pytest.mark.slow
def test_dropout_draws_an_independent_number_per_key():
    """Sixteen scores share a Philox call (a byte each: queries 16 g + u and 16 g + 8 + u, keys 32 h + 8 c + 2 t + b
    of call (g, u, h, t)): any two of them, and scores of different calls, are dropped together at the rate p^2 of
    independent draws, not p as a number read twice would give."""
    batch, heads, n, head_dim, dropout_p = 1, 2, 128, 128, 0.5
    q, k, _ = operands(batch, heads, n, head_dim)
    keep = torch.ones(batch, n, dtype=torch.bool, device=DEVICE)
    dropped = dropped_probabilities(q, k, None, keep, dropout_p, seed=3).double()
    assert abs(dropped.mean() - dropout_p) < 0.03
    by_call = dropped.reshape(heads, n // 16, 2, 8, n // 32, 4, 4, 2)  # (heads, g, row half, u, h, c, t, b)
    groups = by_call.permute(0, 1, 3, 4, 6, 2, 5, 7).reshape(-1, 16)  # (calls, the sixteen scores of one call)
    together = groups.mT @ groups / groups.shape[0]
    off_diagonal = together[~torch.eye(16, dtype=torch.bool, device=together.device)]
    assert (off_diagonal - dropout_p**2).abs().max() < 0.06
    for apart in (2, 32):  # the next call along t, along h
        assert abs((dropped[..., :-apart] * dropped[..., apart:]).mean() - dropout_p**2) < 0.03
    for apart in (1, 16):  # the next call along u, along g
        assert abs((dropped[..., :-apart, :] * dropped[..., apart:, :]).mean() - dropout_p**2) < 0.03


def test_dropout_rate_is_rounded_to_bytes_and_bad_options_are_refused():
    assert triton_attention.kernel_dropout_p(0.0) == 0.0
    assert triton_attention.kernel_dropout_p(0.1) == 26 / 256
    assert triton_attention.kernel_dropout_p(0.5) == 0.5
    assert triton_attention.kernel_dropout_p(1e-4) == 1 / 256  # dropout asked for is never switched off
    assert triton_attention.kernel_dropout_p(0.9999) == 255 / 256
    q = torch.zeros(1, 1, 4, 32, device=DEVICE)
    with pytest.raises(ValueError, match="dropout_p must be in"):
        triton_attention.triton_relative_attention(q, q, q, None, None, reach=1, clip=True, dropout_p=1.0)
    with pytest.raises(ValueError, match="scale must be nonzero"):
        triton_attention.triton_relative_attention(q, q, q, None, None, reach=1, clip=True, scale=0.0)


def test_the_autotuners_picks_are_cached_on_disk_for_later_processes(monkeypatch):
    """Every autotuner asks Triton to keep its picks in its cache on disk (where the compiled tilings go), so a later
    process (the next run; a comparison's next row; the real-scale call's training after its warm-up) launches them
    without timing every tiling again at its first step."""
    asked = []
    autotune = launch.triton.autotune
    monkeypatch.setattr(launch.triton, "autotune", lambda **kwargs: asked.append(kwargs) or autotune(**kwargs))
    launch.autotuned.cache_clear()
    try:
        for kernel in ("forward", "backward"):
            launch.autotuned(kernel, 32, torch.float32)
    finally:
        launch.autotuned.cache_clear()
    assert [kwargs["cache_results"] for kwargs in asked] == [True, True]


@interpreter_only
@pytest.mark.slow
def test_dropout_mask_does_not_depend_on_the_tiling(monkeypatch):
    """The backward kernels tile queries and keys otherwise than the forward, and the GPU's tilings are not the
    interpreter's: every tiling must draw the same mask."""
    batch, heads, n, head_dim, dropout_p = 2, 2, 75, 128, 0.3  # v the identity: head_dim >= n
    q, k, _ = operands(batch, heads, n, head_dim)
    keep = (torch.arange(n)[None, :] < torch.tensor([n, 50])[:, None]).to(DEVICE)
    masks = []
    for tiling in [(16, 32, 1, 1), (32, 64, 1, 1), (64, 128, 1, 1)]:
        monkeypatch.setattr(launch, "configs", lambda kernel, head_dim, dtype, tiling=tiling: [tiling])
        launch.autotuned.cache_clear()
        masks.append(dropped_probabilities(q, k, None, keep, dropout_p, seed=5))
    launch.autotuned.cache_clear()
    assert masks[0].any()
    for mask in masks[1:]:
        assert torch.equal(mask, masks[0])


@interpreter_only
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.slow
def test_the_backward_sums_any_number_of_splits_to_the_reference(splits, monkeypatch):
    """The backward deals a sequence's key blocks (32 keys under the interpreter) among `splits` programs, each
    adding its blocks' shares of dQ and of the row table's edge columns to float32 accumulators of its own, summed
    afterwards: one split holding all five blocks, and three of one or two blocks each, against the reference, with
    pads among the keys and a sequence without real keys."""
    monkeypatch.setattr(launch.Problem, "splits", lambda self, q: splits)
    n = 140
    position = torch.arange(n)
    keep = torch.stack([(position % 9 != 4) & (position < 120), torch.zeros(n, dtype=torch.bool)])
    check_against_reference(TERMS["composite+key"], "clip", batch=2, heads=1, n=n, head_dim=32, reach=3,
                            keep=keep.to(DEVICE))


@interpreter_only
def test_the_atomic_design_adds_every_key_block_into_one_accumulator_to_the_reference(monkeypatch):
    """A program per key block (five of 32 keys under the interpreter), each adding its shares of dQ and of the row
    table's edge columns atomically into one float32 accumulator: against the reference with pads among the keys
    and a sequence without real keys, as the split design is tested above."""
    monkeypatch.setenv(launch.DQ_ENVIRONMENT, "atomic")
    made = []
    original = launch.Problem.accumulators
    monkeypatch.setattr(launch.Problem, "accumulators", lambda self, q, splits: made.append(splits) or
                        original(self, q, splits))
    n = 140
    position = torch.arange(n)
    keep = torch.stack([(position % 9 != 4) & (position < 120), torch.zeros(n, dtype=torch.bool)])
    check_against_reference(TERMS["composite+key"], "clip", batch=2, heads=1, n=n, head_dim=32, reach=3,
                            keep=keep.to(DEVICE))
    assert made == [1]


def test_the_dq_design_follows_the_variable_and_deterministic_algorithms(monkeypatch):
    """CONVATTN_TRITON_DQ chooses; torch.use_deterministic_algorithms(True) keeps the bit-identical split design and
    refuses an explicit atomic one (warn-only mode takes split); a value it cannot take is one line naming it."""
    q = torch.zeros(1, 2, 40, 32, device=DEVICE)
    problem = launch.Problem(q, None, None, None, None, None, 0, 0, True, 0.0, 1.0)
    for asked, design in (("split", "split"), ("atomic", "atomic"), ("", "split" if DEVICE == "cpu" else None)):
        monkeypatch.setenv(launch.DQ_ENVIRONMENT, asked)
        assert design is None or problem.dq_design(q, 1) == design
    monkeypatch.setenv(launch.DQ_ENVIRONMENT, "fast")
    with pytest.raises(ValueError, match="CONVATTN_TRITON_DQ='fast': choose one of auto, split, atomic"):
        problem.dq_design(q, 1)
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        for asked in ("auto", "split"):
            monkeypatch.setenv(launch.DQ_ENVIRONMENT, asked)
            torch.use_deterministic_algorithms(True)
            assert problem.dq_design(q, 1) == "split"
        monkeypatch.setenv(launch.DQ_ENVIRONMENT, "atomic")
        with pytest.raises(RuntimeError, match="asks for the same bits every time"):
            problem.dq_design(q, 1)
        torch.use_deterministic_algorithms(True, warn_only=True)
        assert problem.dq_design(q, 1) == "split"
    finally:
        torch.use_deterministic_algorithms(deterministic)


def test_auto_takes_atomic_adds_only_past_half_the_l2_cache_and_without_the_row_tables_edges():
    """The GPU call timed both designs: atomic adds gained 0-4 % at 2 x 12 x 8,192 without a row table and lost
    13-15 % with one, whose clipped edge columns every key block adds into."""
    l2 = 60 * 2**20
    assert launch.auto_dq_design(l2 // 2, l2, row_edges=False) == "split"
    assert launch.auto_dq_design(l2 // 2 + 1, l2, row_edges=False) == "atomic"
    assert launch.auto_dq_design(250 * 2**20, l2, row_edges=True) == "split"


@pytest.mark.slow
def test_two_backward_passes_give_the_same_bits():
    """Deterministic by default, without atomics: the backward operator run twice on the same inputs and seed gives
    every gradient bit for bit, here with two splits, of two key blocks and of one, under the interpreter (on a GPU
    as many splits as fill it, their programs running at once)."""
    batch, heads, n, head_dim = 2, 2, 70, 32  # three key blocks under the interpreter: every launch is seconds there
    q, k, v = (x.float() for x in operands(batch, heads, n, head_dim))
    rel = make_relative(TERMS["composite+key"], "clip", heads, head_dim, reach=4)
    row, key = (t.detach().float() for t in rel.tables(q, k))
    position = torch.arange(n)
    keep = torch.stack([position < 60, position % 5 != 2]).to(DEVICE).view(torch.uint8)
    args = (q, k, v, row[:1].contiguous(), key, keep, None, torch.tensor(7, device=DEVICE), 0, 4, True, 0.2, 0.2)
    out, lse = operator.attention_forward(*args)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    first, second = (operator.attention_backward(grad_out, q, k, v, out, lse, *args[3:]) for _ in range(2))
    for a, b in zip(first, second, strict=True):
        assert a.abs().sum() > 0 and torch.equal(a, b)
    # projected tables: their shares of dq and dk are summed inside the kernels, in a fixed order too
    kernels = [t.detach().float().contiguous() for t in (rel.query_kernel, rel.key_kernel)]
    row, key = operator.relative_tables(q, k, rel.fixed.detach().float(), *kernels)
    args = (*args[:3], row, key, *args[5:])
    out, lse = operator.attention_forward(*args)
    first, second = (operator.attention_backward(grad_out, q, k, v, out, lse, *args[3:], None, *kernels)
                     for _ in range(2))
    for a, b in zip(first, second, strict=True):
        assert a.abs().sum() > 0 and torch.equal(a, b)


@pytest.mark.skipif(DEVICE != "cuda", reason="half precision runs compiled on a GPU only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_against_float32(dtype):
    """At a length that spans several tiles of every kernel, against the float32 kernel (itself checked above)."""
    rel = make_relative(TERMS["composite+key"], "clip", heads=4, head_dim=64, reach=8)
    q, k, v = (x.float().requires_grad_() for x in operands(2, 4, 300, 64))
    keep = (torch.arange(300)[None, :] < torch.tensor([300, 211])[:, None]).to(DEVICE)
    weights = torch.randn(2, 4, 300, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(DEVICE)
    results = {}
    for precision in (torch.float32, dtype):
        out = kernel_attention(q, k, v, rel, precision, keep=keep)
        results[precision] = [out, *torch.autograd.grad((out * weights).sum(), [q, k, v, *rel.parameters()])]
    for half, single in zip(results[dtype], results[torch.float32], strict=True):
        assert relative_error(half.double(), single.double()) < 2e-2


@pytest.mark.parametrize("make", slow_except([make_layer, make_convbert_layer], make_convbert_layer))
def test_layers_take_the_kernel_by_name_and_match_eager(make, monkeypatch):
    """Composite attention and ConvBERT's heads with attn_implementation="convattn_triton" against "eager"."""
    layer = make(TERMS["composite+key"], "clip", hidden_size=128).to(DEVICE)
    x = torch.randn(2, 19, 128, generator=torch.Generator().manual_seed(0)).to(DEVICE).requires_grad_()
    keep = (torch.arange(19)[None, :] < torch.tensor([19, 12])[:, None]).to(DEVICE)
    taken = []
    original = dispatch.relative_path
    monkeypatch.setattr(dispatch, "relative_path", lambda *args: taken.append(original(*args)) or taken[-1])
    results = {}
    for implementation in ("convattn_triton", "eager"):
        layer.config._attn_implementation = implementation
        out = layer(x, TokenMask(keep))[0]
        loss = (out * keep[..., None]).pow(2).sum()
        results[implementation] = [out, *torch.autograd.grad(loss, [x, *layer.parameters()])]
    assert taken == ["triton", "dense"]
    for ours, expected in zip(results["convattn_triton"], results["eager"], strict=True):
        assert relative_error(ours.double().cpu(), expected.double().cpu()) < 1e-4


@pytest.mark.slow
def test_models_load_with_the_kernel_and_switch_to_and_from_it(tmp_path):
    model = ConvAttnModel(tiny_config("chang2021-small/composite", hidden_size=64, num_attention_heads=2))
    randomize_(model)
    model.save_pretrained(tmp_path)
    ids = torch.randint(5, 101, (2, 27), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    attention_mask = torch.ones(2, 27, dtype=torch.long, device=DEVICE)
    attention_mask[1, 20:] = 0
    outputs = {}
    for implementation in ("convattn_triton", "eager"):
        loaded = ConvAttnModel.from_pretrained(tmp_path, attn_implementation=implementation).to(DEVICE)
        assert loaded.config._attn_implementation == implementation
        hidden = loaded(input_ids=ids, attention_mask=attention_mask).last_hidden_state
        grads = torch.autograd.grad(hidden[attention_mask.bool()].pow(2).sum(), list(loaded.parameters()),
                                    allow_unused=True)
        outputs[implementation] = (hidden, grads)
    real = attention_mask.bool()
    torch.testing.assert_close(outputs["convattn_triton"][0][real], outputs["eager"][0][real], rtol=1e-4, atol=1e-5)
    for ours, expected in zip(outputs["convattn_triton"][1], outputs["eager"][1], strict=True):
        if expected is not None:
            assert relative_error(ours.double().cpu(), expected.double().cpu()) < 1e-4
    loaded.set_attn_implementation("convattn_triton")
    assert loaded.config._attn_implementation == "convattn_triton"
    with torch.no_grad():
        switched = loaded(input_ids=ids, attention_mask=attention_mask).last_hidden_state
    torch.testing.assert_close(switched[real], outputs["convattn_triton"][0][real].detach(), rtol=1e-4, atol=1e-5)
    loaded.set_attn_implementation("sdpa")
    assert loaded.config._attn_implementation == "sdpa"


@pytest.mark.slow
def test_gradient_checkpointing_through_the_kernel_replays_its_dropout():
    """Checkpointed layers run the kernel's eager call again in backward: its seed, drawn from the generator that
    checkpointing restores, drops the same scores, so the loss and every gradient are the plain step's."""
    from convattn import ConvAttnForMaskedLM

    ids = torch.randint(5, 101, (2, 19), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 13:] = 0
    labels = ids.masked_fill(torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE) > 0.4, -100)
    steps = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = ConvAttnForMaskedLM(tiny_config("chang2021-small/composite", hidden_size=64, num_attention_heads=2,
                                                attention_probs_dropout_prob=0.3)).to(DEVICE).train()
        model.set_attn_implementation("convattn_triton")
        if checkpointing:
            checkpoint_activations(model)
        seeds = []
        forward = operator.run_forward
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(operator, "run_forward", lambda *args, seeds=seeds, forward=forward: seeds.append(
                args[7].item()) or forward(*args))
            torch.manual_seed(5)
            loss = model(input_ids=ids, attention_mask=attention_mask, labels=labels).loss
            loss.backward()
        layers = model.config.num_hidden_layers
        assert len(seeds) == layers * (2 if checkpointing else 1)
        if checkpointing:  # each layer's recomputation drew its forward's seed again
            assert seeds[layers:] == seeds[:layers][::-1]  # backward runs the layers last first
        steps.append(step_of(model, loss))
    assert_same_step(steps)


def test_a_compiled_call_converts_the_bool_mask_where_eager_bitcasts_it():
    """Under torch.compile the key mask reaches the operator through a conversion to bytes, never a bitcast:
    Inductor (torch 2.11) cannot lower a bool bitcast, and the 2026-11-30 GPU call's CUDA-graph tests failed on it.
    The compiled call computes what eager does."""
    graphs = []

    def capture(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    q, k, v = (x.float() for x in operands(2, 2, 11, 16))
    keep = (torch.arange(11)[None, :] < torch.tensor([11, 6])[:, None]).to(DEVICE)

    def attend(q, k, v, keep):
        return triton_relative_attention(q, k, v, None, None, reach=0, clip=True, keep=keep)

    compiled = torch.compile(attend, backend=capture, fullgraph=True)(q, k, v, keep)
    assert torch.equal(compiled, attend(q, k, v, keep))
    casts = [(node.target, node.args[1:]) for graph in graphs for node in graph.graph.nodes
             if node.op == "call_method" and node.target in ("view", "to") and torch.uint8 in node.args[1:]]
    assert casts == [("to", (torch.uint8,))]


def test_attention_interface_serves_plain_attention():
    from transformers import AttentionInterface

    import convattn

    convattn.register_auto_classes()
    function = AttentionInterface()["convattn_triton"]
    q, k, v = (x.requires_grad_() for x in operands(2, 2, 13, 32))
    keep = (torch.arange(13)[None, :] < torch.tensor([13, 9])[:, None]).to(DEVICE)
    additive = torch.zeros(2, 1, 1, 13, device=DEVICE).masked_fill(~keep[:, None, None, :], -1e9)
    out, weights = function(None, *(x.float() for x in (q, k, v)), additive)
    assert weights is None
    expected = reference_attention(q, k, v, None, keep).transpose(1, 2)
    assert relative_error(out.double(), expected) < 1e-4


def test_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 1, 4, 16)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        triton_relative_attention(q, q, q, None, None, reach=0, clip=True)


def operator_arguments(dropout_p=0.2):
    """Arguments of the forward operator at small shapes: both tables (q, k, v and they requiring grad), padding, a
    seed on DEVICE."""
    q, k, v = (x.float() for x in operands(2, 2, 11, 16))
    rel = make_relative(TERMS["composite+key"], "clip", 2, 16, reach=2)
    tables = [t.detach().float().requires_grad_() for t in rel.tables(q, k)]
    keep = (torch.arange(11)[None, :] < torch.tensor([11, 6])[:, None]).to(DEVICE).view(torch.uint8)
    seed = torch.tensor(5, device=DEVICE)
    return (*(x.requires_grad_() for x in (q, k, v)), *tables, keep, None, seed, 0, 2, True, dropout_p, 0.25)


@pytest.mark.slow
def test_the_kernels_are_operators_that_torch_compile_can_trace():
    """Schema, fake tensors, autograd registration and AOT dispatch of the forward and backward operators
    (torch.library.opcheck), with dropout and ALiBi's slopes, and without either (the seed then absent, the slopes
    left to their default)."""
    for dropout_p in (0.2, 0.0):
        args = operator_arguments(dropout_p)
        slopes = torch.tensor([0.5, 0.25], device=DEVICE)
        args = (*args[:7], None, *args[8:]) if dropout_p == 0 else (*args, slopes)
        torch.library.opcheck(operator.attention_forward, args)
        args = tuple(x.detach() if isinstance(x, torch.Tensor) else x for x in args)  # the backward has no backward
        out, lse = operator.attention_forward(*args)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
        torch.library.opcheck(operator.attention_backward, (grad_out, *args[:3], out, lse, *args[3:]))
    # the tables projected by their own operator, the attention operators given the parameters they came from
    q, k, v, *_ = operator_arguments()
    rel = make_relative(TERMS["composite+key"], "clip", 2, 16, reach=2)
    parameters = [t.detach().float().requires_grad_() for t in (rel.fixed, rel.query_kernel, rel.key_kernel)]
    torch.library.opcheck(operator.relative_tables, (q.detach(), k.detach(), *(t.detach() for t in parameters)))
    tables = operator.relative_tables(q.detach(), k.detach(), *(t.detach() for t in parameters))
    args = (q, k, v, *tables, None, None, None, 0, 2, True, 0.0, 0.25, None, *parameters)
    torch.library.opcheck(operator.attention_forward, args)
    args = tuple(x.detach() if isinstance(x, torch.Tensor) else x for x in args)
    out, lse = operator.attention_forward(*args)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    torch.library.opcheck(operator.attention_backward, (grad_out, *args[:3], out, lse, *args[3:14], *args[15:]))


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_an_eager_call_skips_torch_library_and_computes_the_operators_bits(packed, monkeypatch):
    """An eager call takes operator._EagerAttention (the kernels launched directly: torch.library's dispatch was
    118 of the 226 us of host work per forward + backward, benchmarks/triton_host_cost.py); under a dispatch mode,
    as under torch.compile, the operators. Both give the same output and gradients, bit for bit: composite+key
    projected, ALiBi, padding or packed sequences, and dropout."""
    heads, head_dim, lengths = 2, 16, [19, 12]
    rel = make_relative(ALIBI_TERMS["composite+key+alibi"], "clip", heads, head_dim, reach=3, alibi=True).float()
    if packed:
        q, k, v = (x.float()[0].transpose(0, 1)[:sum(lengths)].contiguous().requires_grad_()
                   for x in operands(1, heads, sum(lengths), head_dim))
        extra = dict(cu_seqlens=torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32, device=DEVICE),
                     max_seqlen=max(lengths))
    else:
        q, k, v = (x.float().requires_grad_() for x in operands(2, heads, max(lengths), head_dim))
        extra = dict(keep=(torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).to(DEVICE))
    weights = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)

    def run():
        torch.manual_seed(7)
        out = triton_relative_attention(q, k, v, **dispatch.kernel_inputs(rel, q, k), dropout_p=0.2, **extra)
        return [out, *torch.autograd.grad((out * weights).sum(), [q, k, v, *rel.parameters()])]

    operators = {name: getattr(operator, name) for name in ("relative_tables", "attention_forward",
                                                             "attention_backward")}
    with monkeypatch.context() as patch:
        for name in operators:
            patch.setattr(operator, name, lambda *args, name=name: pytest.fail(f"an eager call reached {name}"))
        eager = run()
    with Dispatched() as dispatched:
        through_operators = run()
    assert {"triton_relative_tables", "triton_relative_attention",
            "triton_relative_attention_backward"} <= set(dispatched.names)
    assert eager[0].abs().sum() > 0 and all(grad.abs().sum() > 0 for grad in eager[1:])
    for ours, theirs in zip(eager, through_operators, strict=True):
        assert torch.equal(ours, theirs)
    # a tensor subclass (DTensor, a wrapper) takes the operators, which its own dispatch may know
    reached = []
    with monkeypatch.context() as patch:
        patch.setattr(operator, "attention_forward", lambda *args: reached.append(1) or operators["attention_forward"](
            *args))
        triton_relative_attention(q.detach().as_subclass(Marked), k.detach(), v.detach(), None, None, reach=0,
                                  clip=True, **extra)
    assert reached == [1]


class Marked(torch.Tensor):
    """A tensor subclass that changes nothing."""


@pytest.mark.slow
def test_the_seed_is_drawn_on_the_operands_device_and_saved_for_backward(monkeypatch):
    """One front door: triton_relative_attention calls the forward runner, its seed a tensor drawn from torch's
    generator on the operands' device (on a GPU a CUDA tensor, never one drawn on the CPU per call), and none without
    dropout. The same generator state gives the same output and gradients, bit for bit."""
    seeds = []
    forward = operator.run_forward
    monkeypatch.setattr(operator, "run_forward", lambda *args: seeds.append(args[7]) or forward(*args))
    batch, heads, n, head_dim = 2, 2, 23, 16
    q, k, v = (x.float().requires_grad_() for x in operands(batch, heads, n, head_dim))
    rel = make_relative(TERMS["composite+key"], "clip", heads, head_dim, reach=3)
    row, key = (t.detach().float() for t in rel.tables(q, k))
    row = row[:1].clone().requires_grad_()  # one row table for the whole batch, as the fixed term alone gives
    key = key.requires_grad_()
    keep = (torch.arange(n)[None, :] < torch.tensor([n, 17])[:, None]).to(DEVICE)
    weights = torch.randn(batch, heads, n, head_dim, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    results = []
    for _ in range(2):
        torch.manual_seed(11)
        out = triton_relative_attention(q, k, v, row, key, reach=3, clip=True, keep=keep, dropout_p=0.25)
        results.append([out, *torch.autograd.grad((out * weights).sum(), [q, k, v, row, key])])
    triton_relative_attention(q, k, v, row, key, reach=3, clip=True, keep=keep)
    assert [(seed.device.type, seed.dtype, seed.shape) for seed in seeds[:2]] == [(DEVICE, torch.int64, ())] * 2
    assert torch.equal(seeds[0], seeds[1]) and seeds[2] is None
    assert results[0][0].abs().sum() > 0
    for first, second in zip(*results, strict=True):
        assert torch.equal(first, second)


@pytest.mark.skipif(DEVICE != "cuda", reason="the GPU's autotuned and compiled launches (the interpreter has none)")
def test_repeated_calls_compute_the_same_bits():
    """The first call of a problem autotunes, the second and later launch the pick: all give the same bits, dropout
    (same torch seed) and gradients included; a misaligned view is compiled for apart and still matches the aligned
    call."""
    rel = make_relative(TERMS["composite+key"], "clip", heads=4, head_dim=64, reach=8)
    q, k, v = (x.to(torch.bfloat16) for x in operands(2, 4, 300, 64))
    keep = (torch.arange(300)[None, :] < torch.tensor([300, 211])[:, None]).to(DEVICE)
    weights = torch.randn(2, 4, 300, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE, torch.bfloat16)

    def call(q, k, v):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        torch.manual_seed(3)
        out = kernel_attention(q, k, v, rel, torch.bfloat16, keep=keep, dropout_p=0.1)
        return [out, *torch.autograd.grad((out * weights).sum(), [q, k, v, *rel.parameters()])]

    results = [call(q, k, v) for _ in range(4)]
    for later in results[1:]:
        for a, b in zip(results[0], later, strict=True):
            assert torch.equal(a, b)
    shifted = [torch.empty(x.numel() + 1, dtype=x.dtype, device=DEVICE)[1:].view(x.shape).copy_(x) for x in (q, k, v)]
    assert shifted[0].data_ptr() % 16 != 0
    for a, b in zip(call(*shifted), results[0], strict=True):
        assert relative_error(a.double(), b.double()) < 1e-2
