"""ConvBERT's per-token convolution kernels (`plot attention` on a ConvBERT checkpoint) against a loop reference."""

from __future__ import annotations

import pytest
import torch
from helpers.reference import depthwise_conv_loops, linear
from helpers.tiny import randomize_, tiny_config
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from convattn import ConvAttnForMaskedLM
from convattn.analysis.convbert_kernels import position_kernels, spread_kernels
from convattn.cli import main

WORDS = "the quick brown fox jumps over lazy dog and which had been asleep did not notice that anything happened"
KERNEL = 5


@pytest.fixture(params=["query", "key"])
def checkpoint(tmp_path, request):
    vocab = {tok: i for i, tok in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS.split()])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    model = ConvAttnForMaskedLM(tiny_config("chang2021-small/convbert", vocab_size=len(vocab),
                                            conv_kernel_size=KERNEL, convbert_kernel_from=request.param))
    randomize_(model)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def reference_kernel_matrix(attention, x: torch.Tensor) -> torch.Tensor:
    """(n, n): row i holds the softmax over the taps of conv_kernel_layer(Ks * Q) at columns i - K//2 .. i + K//2,
    averaged over conv heads, one tap at a time. Jiang et al.: every tap from token i's own kernel; Chang et al.
    (kernels from the key): tap t from the kernel of its key j = i + t - K//2, taps outside the text left out."""
    n, heads, taps = x.shape[1], attention.num_heads, attention.kernel_size
    sep = attention.key_conv_attn_layer
    spans = depthwise_conv_loops(x, sep.depthwise.weight, sep.depthwise.bias)
    key_span = spans @ sep.pointwise.weight[:, :, 0].double().T + sep.bias[:, 0].double()
    logits = linear(key_span * linear(x, attention.query), attention.conv_kernel_layer).view(n, heads, taps)
    matrix = torch.zeros(n, n, dtype=torch.float64)
    from_key = attention.config.convbert_kernel_from == "key"
    for i in range(n):
        keys = [i + t - taps // 2 for t in range(taps)]
        if from_key:
            scores = [torch.tensor([logits[j, g, t] if 0 <= j < n else -10000.0 for t, j in enumerate(keys)],
                                   dtype=torch.float64) for g in range(heads)]
        else:
            scores = [logits[i, g] for g in range(heads)]
        kernel = torch.stack([torch.softmax(score, dim=0) for score in scores]).mean(dim=0)
        for t, j in enumerate(keys):
            if 0 <= j < n:
                matrix[i, j] = kernel[t]
    return matrix


def test_kernels_match_a_direct_computation(checkpoint):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(checkpoint).eval()
    input_ids = torch.tensor([[2, 5, 6, 7, 8, 9, 10, 11, 12, 3]])
    layer_inputs = {}
    hooks = [layer.attention.self.register_forward_pre_hook(
        lambda module, args, index=index: layer_inputs.__setitem__(index, args[0].detach().double()))
        for index, layer in enumerate(model.encoder.layer)]
    kernels = position_kernels(model, input_ids)
    for hook in hooks:
        hook.remove()
    n, half = input_ids.shape[1], KERNEL // 2
    assert sorted(kernels) == [0, 1]
    for index, matrix in kernels.items():
        assert matrix.shape == (n, n)
        expected = reference_kernel_matrix(model.encoder.layer[index].attention.self, layer_inputs[index])
        torch.testing.assert_close(matrix.double(), expected, rtol=1e-5, atol=1e-6)
        distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs()
        assert (matrix[distance > half] == 0).all()
        sums = matrix.sum(dim=1)
        torch.testing.assert_close(sums[half : n - half], torch.ones(n - 2 * half))  # whole window inside
        assert (sums <= 1 + 1e-6).all()


def test_spread_kernels_places_taps_on_the_diagonals():
    kernels = torch.tensor([[0.1, 0.2, 0.7], [0.3, 0.3, 0.4], [0.5, 0.25, 0.25]])
    expected = torch.tensor([[0.2, 0.7, 0.0], [0.3, 0.3, 0.4], [0.0, 0.5, 0.25]])
    torch.testing.assert_close(spread_kernels(kernels), expected)


@pytest.mark.slow
def test_plot_attention_writes_the_kernel_figure(checkpoint, tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["plot", "attention", str(checkpoint), "--text", "the lazy dog did not notice",
                 "--output-dir", str(out)]) == 0
    for name in ("attention_maps.png", "convbert_kernels.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert str(out / "convbert_kernels.png") in capsys.readouterr().out
    assert main(["plot", "attention", str(checkpoint), "--layer", "-1", "--output-dir", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "convbert_kernels.png").is_file()
    assert main(["plot", "attention", str(checkpoint), "--layer", "2"]) == 2
    assert "--layer 2 is out of range" in capsys.readouterr().err
