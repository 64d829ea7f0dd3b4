"""`convattn plot kernels|attention` on a tiny checkpoint: files written, numbers right."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny import randomize_, tiny_config
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from convattn import ConvAttnForMaskedLM
from convattn.analysis.kernels import dynamic_kernels, fixed_kernels, sort_by_adjacent_preference
from convattn.cli import main

WORDS = "the quick brown fox jumps over lazy dog and which had been asleep did not notice that anything happened"


@pytest.fixture
def checkpoint(tmp_path):
    return save_word_model(tmp_path)


def save_word_model(tmp_path, **fields):
    vocab = {tok: i for i, tok in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS.split()])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    torch.manual_seed(0)
    model = ConvAttnForMaskedLM(tiny_config("chang2021-small/composite+depthwise", vocab_size=len(vocab), **fields))
    randomize_(model)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_plot_kernels_writes_the_three_figures(checkpoint, capsys):
    assert main(["plot", "kernels", str(checkpoint)]) == 0
    for name in ("fixed_kernels.png", "depthwise_kernels.png", "dynamic_kernels.png"):
        path = checkpoint / "plots" / name
        assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"
    assert not list((checkpoint / "plots").glob(".*tmp*"))


def test_plot_attention_writes_the_map(checkpoint, tmp_path):
    out = tmp_path / "figs"
    assert main(["plot", "attention", str(checkpoint), "--text", "the lazy dog", "--output-dir", str(out)]) == 0
    assert (out / "attention_maps.png").read_bytes()[:4] == b"\x89PNG"


def test_an_output_folder_whose_name_starts_with_a_dash_is_given_with_an_equals_sign(checkpoint, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "attention", str(checkpoint), "--text", "the lazy dog", "--output-dir=-figs"]) == 0
    assert (tmp_path / "-figs" / "attention_maps.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("kind", ["attention", "kernels"])
def test_a_text_longer_than_the_model_says_how_many_tokens_were_cut(tmp_path, capsys, kind):
    # the figures showed the first positions only, without a word
    checkpoint = save_word_model(tmp_path / "model", max_position_embeddings=8)
    assert main(["plot", kind, str(checkpoint), "--text", WORDS, "--output-dir", str(tmp_path / "figs")]) == 0
    err = capsys.readouterr().err
    assert ("convattn plot: --text has 19 tokens, more than the model's 8 positions: the figures show its first 8 "
            "(11 tokens cut)") in err
    assert main(["plot", kind, str(checkpoint), "--text", "the lazy dog", "--output-dir", str(tmp_path / "figs")]) == 0
    assert "cut" not in capsys.readouterr().err


def test_kernel_values_come_from_the_model(checkpoint):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(checkpoint).eval()
    fixed = fixed_kernels(model)
    assert fixed.shape == (2, 4, 17)
    torch.testing.assert_close(fixed[1], model.encoder.layer[1].attention.self.relative.fixed)
    encoded = AutoTokenizer.from_pretrained(checkpoint)("the quick brown fox", return_tensors="pt")
    dynamic = dynamic_kernels(model, encoded["input_ids"], encoded["attention_mask"])
    assert dynamic.shape == (2, 4, 17) and torch.isfinite(dynamic).all()


@pytest.mark.parametrize(("preset", "has_fixed", "has_dynamic"), [
    ("chang2021-small/fixed", True, False), ("chang2021-small/dynamic", False, True),
    ("chang2021-small/alibi", False, False)])
def test_a_model_with_one_kind_of_kernel_gives_that_kind_and_none_of_the_other(preset, has_fixed, has_dynamic):
    model = ConvAttnForMaskedLM(tiny_config(preset)).convattn.eval()
    ids = torch.randint(5, 101, (1, 9), generator=torch.Generator().manual_seed(0))
    assert (fixed_kernels(model) is not None) == has_fixed
    assert (dynamic_kernels(model, ids, torch.ones_like(ids)) is not None) == has_dynamic


def test_kernel_figures_label_offsets_from_minus_to_plus_the_reach(tmp_path, drawn):
    import convattn.analysis.kernels as module

    figures = drawn(module)
    module.plot_layer_head_kernels(torch.randn(2, 4, 17), "fixed", tmp_path / "fixed.png")
    module.plot_depthwise_kernels(torch.randn(32, 7), "depthwise", tmp_path / "depthwise.png")
    labels = [[label.get_text() for label in fig.axes[axis].get_xticklabels()] for fig, axis in
              ((figures[0], 1), (figures[1], 0))]
    assert labels == [["-8", "-4", "0", "4", "8"], ["-3", "-2", "-1", "0", "1", "2", "3"]]


def test_dynamic_kernels_are_the_models_query_term_averaged_over_the_real_tokens():
    """Against the attention's own dynamic term (RelativePositionBias.row_table less the fixed kernels) in float64,
    each text alone: the batch's padding and the scale 1/sqrt(d) the attention applies must both come out right."""
    model = ConvAttnForMaskedLM(tiny_config("chang2021-small/composite")).convattn.eval()
    randomize_(model)
    lengths, n = [9, 4, 6], 9
    ids = torch.randint(5, 101, (3, n), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(n)[None] < torch.tensor(lengths)[:, None]).long()
    found = dynamic_kernels(model, ids.masked_fill(mask == 0, 0), mask)

    reference = model.double()
    sums = torch.zeros(found.shape, dtype=torch.float64)
    queries = {}
    for index, layer in enumerate(reference.encoder.layer):
        layer.attention.self.query.register_forward_hook(
            lambda module, args, out, index=index: queries.__setitem__(index, out))
    for row, length in enumerate(lengths):
        with torch.no_grad():
            reference(input_ids=ids[row:row + 1, :length])
        for index, layer in enumerate(reference.encoder.layer):
            relative = layer.attention.self.relative
            q = queries[index].unflatten(-1, (relative.fixed.shape[0], -1)).transpose(1, 2)  # (1, heads, n, d)
            with torch.no_grad():
                term = relative.row_table(q) - relative.fixed[None, :, None, :]
            sums[index] += term[0].sum(dim=1)
    torch.testing.assert_close(found.double(), sums / sum(lengths), rtol=1e-5, atol=1e-6)


def test_attention_maps_average_every_head_of_each_layer():
    from convattn.analysis.attention_maps import attention_maps

    model = ConvAttnForMaskedLM(tiny_config("chang2021-small/composite")).convattn.eval()
    randomize_(model)
    ids = torch.randint(5, 101, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        per_head = model(input_ids=ids, output_attentions=True).attentions  # each (1, heads, n, n)
    maps = attention_maps(model, ids)
    assert sorted(maps) == [0, 1]
    for layer, heads in enumerate(per_head):
        assert not torch.allclose(heads[0, 0], heads[0, 1])  # the heads differ, so the mean is not any one
        torch.testing.assert_close(maps[layer], heads[0].mean(dim=0))
        torch.testing.assert_close(maps[layer].sum(-1), torch.ones(7))


def test_every_layers_map_gets_its_own_panel_on_its_own_colour_scale(tmp_path, drawn):
    """Six layers (not a multiple of the four columns): six visible panels, titled in order, each scaled to its own
    maximum, the spare panels hidden; tokens label the axes up to 40 of them."""
    import convattn.analysis.attention_maps as module

    figures = drawn(module)
    maps = {layer: torch.rand(40, 40) * (layer + 1) for layer in range(6)}
    module.plot_attention_maps(maps, [f"t{i}" for i in range(40)], "six layers", tmp_path / "maps.png")
    panels = [ax for ax in figures[0].axes if ax.get_label() != "<colorbar>"]
    shown = [ax for ax in panels if ax.get_visible()]
    assert len(panels) == 8 and [ax.get_title() for ax in shown] == [f"layer {layer}" for layer in range(6)]
    for ax, matrix in zip(shown, maps.values(), strict=True):
        assert ax.images[0].get_clim() == (0, pytest.approx(float(matrix.max())))
        assert [label.get_text() for label in ax.get_xticklabels()] == [f"t{i}" for i in range(40)]


def test_channels_sorted_from_previous_to_next_token_preference():
    kernels = torch.zeros(3, 5)
    kernels[0, 3] = 1.0  # next token (tap r + 1)
    kernels[1, 1] = 1.0  # previous token (tap r - 1)
    ordered = sort_by_adjacent_preference(kernels)
    assert ordered[0, 1] == 1.0 and ordered[-1, 3] == 1.0


def test_model_without_kernels_is_a_usage_error(tmp_path, capsys):
    ConvAttnForMaskedLM(tiny_config("chang2021-small/absolute")).save_pretrained(tmp_path)
    assert main(["plot", "kernels", str(tmp_path)]) == 2
    assert "no lightweight or depthwise convolution kernels" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["kernels", "attention"])
def test_layer_out_of_range_is_one_line_before_any_figure(checkpoint, kind, capsys):
    assert main(["plot", kind, str(checkpoint), "--layer", "99"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("convattn plot: error: --layer 99 is out of range")
    assert not (checkpoint / "plots").exists()


def test_corrupt_weights_are_one_line_exit_2(checkpoint, capsys):
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated copy
    assert main(["plot", "kernels", str(checkpoint)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("convattn plot: error:") and "truncated or corrupt" in err and "\n" not in err
    assert not (checkpoint / "plots").exists()
