"""Every preset builds, and the paper rows have the SPEC's exact parameter counts."""

from __future__ import annotations

import pytest
import torch

from convattn import ConvAttnConfig, ConvAttnForMaskedLM
from convattn.presets import preset_fields, preset_names

# SPEC section 2, BertForMaskedLM-style count (tied decoder once, pooler not counted)
SPEC_COUNTS = {
    "chang2021-small/none": 13_414_324,
    "chang2021-small/absolute": 13_430_708,
    "chang2021-small/fixed": 13_415_140,
    "chang2021-small/dynamic": 13_427_380,
    "chang2021-small/composite": 13_428_196,
    "chang2021-small/depthwise": 13_469_620,
    "chang2021-small/conv-v": 13_469_620,
    "chang2021-small/conv-qk": 13_524_916,
    "chang2021-small/conv-qkv": 13_580_212,
    "chang2021-small/composite+key": 13_441_252,
    "chang2021-small/composite+depthwise": 13_483_492,
    "chang2021-small/composite+conv-v": 13_483_492,
    "chang2021-small/composite+conv-qk": 13_538_788,
    "chang2021-small/composite+conv-qkv": 13_594_084,
    # not the paper's rows (issue 63): rotary and ALiBi learn nothing, so they count as `none` and composite
    "chang2021-small/rotary": 13_414_324,
    "chang2021-small/alibi": 13_414_324,
    "chang2021-small/composite+rotary": 13_428_196,
    "chang2021-base/absolute": 108_821_044,
    "chang2021-base/fixed": 108_725_188,
    "chang2021-base/dynamic": 108_735_796,
    # base-size rows beside the paper's: as `none` (108,722,740 = fixed's count less 12 x 12 x 17) and composite
    "chang2021-base/rotary": 108_722_740,
    "chang2021-base/alibi": 108_722_740,
    "chang2021-base/composite+rotary": 108_738_244,
}


def count(name: str) -> int:
    with torch.device("meta"):
        return ConvAttnForMaskedLM(ConvAttnConfig.from_preset(name)).num_parameters()


@pytest.mark.parametrize("name", list(SPEC_COUNTS))
def test_parameter_count_matches_spec(name):
    assert count(name) == SPEC_COUNTS[name]


def test_composite_combinations_are_sums_of_their_parts():
    base = count("chang2021-small/none")
    part = {name: count(f"chang2021-small/{name}") - base
            for name in ("fixed", "dynamic", "depthwise", "conv-v", "conv-qk", "conv-qkv")}
    key_table = 12 * 64 * 17
    assert count("chang2021-small/composite") - base == part["fixed"] + part["dynamic"]
    assert count("chang2021-small/composite+key") - base == part["fixed"] + part["dynamic"] + key_table
    for combo in ("depthwise", "conv-v", "conv-qk", "conv-qkv"):
        assert count(f"chang2021-small/composite+{combo}") - base == part["fixed"] + part["dynamic"] + part[combo]


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_builds(name):
    with torch.device("meta"):
        model = ConvAttnForMaskedLM(ConvAttnConfig.from_preset(name))
    assert model.config.preset == name
    assert model.num_parameters() > 0


# rows beside Chang et al.'s, in their families for equal-size comparisons (issue 63)
BEYOND_THE_PAPER = {f"chang2021-{size}/{row}": kind for size in ("small", "base")
                    for row, kind in (("rotary", "rotary"), ("alibi", "alibi"), ("composite+rotary", "rotary"))}


def test_paper_rows_use_no_absolute_positions_except_absolute():
    for name in preset_names():
        if name.startswith("chang2021-") and name.split("/")[1] not in ("absolute", "convbert"):
            expected = BEYOND_THE_PAPER.get(name, "none")
            assert preset_fields(name)["position_embedding_type"] == expected, name


def test_overrides_apply_and_unknown_preset_is_named():
    config = ConvAttnConfig.from_preset("chang2021-small/composite", num_hidden_layers=2)
    assert config.num_hidden_layers == 2 and config.relative_terms == ["fixed", "dynamic_query"]
    with pytest.raises(ValueError, match=r"unknown preset 'nope/x'.*chang2021-small"):
        ConvAttnConfig.from_preset("nope/x")
