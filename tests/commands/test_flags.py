"""The flags read back as the library's options (pretrain_flags.py, compare_flags.py, fine_tune_flags.py): each
value given reaches its option, typed as its field is, and a flag without what it needs is one UsageError naming it."""

from __future__ import annotations

import os

import pytest

from convattn.cli import build_parser
from convattn.commands.compare_flags import glue_request, squad_request
from convattn.commands.pretrain_flags import config_overrides, data_options
from convattn.errors import UsageError


def parsed(command: str, *argv: str):
    runs = ["--presets", "chang2021-small/absolute"] if command == "compare" else []
    return build_parser().parse_args([command, *runs, *argv])


def test_every_architecture_flag_given_reaches_the_config_even_zero():
    """0 is a value (the config refuses it, naming the field), not "unset": only None keeps the recipe's."""
    assert config_overrides(parsed("pretrain", "--layers", "0", "--hidden", "64")) == {
        "num_hidden_layers": 0, "hidden_size": 64}


@pytest.mark.parametrize(("item", "expected"), [
    (" hidden_dropout_prob =0", {"hidden_dropout_prob": 0}),  # spaces around the name; an int for a float field
    ("relative_terms=[fixed, dynamic_query]", {"relative_terms": ["fixed", "dynamic_query"]}),
])
def test_set_reads_its_field_and_a_yaml_value(item, expected):
    assert config_overrides(parsed("pretrain", "--set", item)) == expected


@pytest.mark.parametrize(("item", "said"), [
    ("=3", "--set '=3' must look like FIELD=VALUE"),
    ("_attn_implementation=eager", "--set _attn_implementation: not a config field"),
    ("num_hidden_layers=true", "--set num_hidden_layers=True: expected int (like the default"),
    ("hidden_dropout_prob=yes", "--set hidden_dropout_prob=True: expected float"),
])
def test_a_set_item_that_names_no_field_or_has_another_type_is_refused(item, said):
    with pytest.raises(UsageError, match=said.replace("[", r"\[").replace("(", r"\(")):
        config_overrides(parsed("pretrain", "--set", item))


def test_a_bare_dataset_flag_takes_wikitext_103_and_a_local_tokenizer_is_recorded_absolute(tmp_path, monkeypatch):
    """A run records its data options and --resume reads them from elsewhere: a tokenizer folder given relative is
    made absolute; a hub tokenizer's name is left as it is."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tok").mkdir()
    bare = data_options(parsed("pretrain", "--dataset", "--tokenizer", "tok"))
    assert (bare["dataset"], bare["dataset_config"]) == ("Salesforce/wikitext", "wikitext-103-raw-v1")
    assert bare["tokenizer"] == os.path.join(str(tmp_path), "tok")
    other = data_options(parsed("pretrain", "--dataset", "user/corpus", "--tokenizer", "bert-base-uncased"))
    assert (other["dataset_config"], other["tokenizer"]) == (None, "bert-base-uncased")


def test_the_follow_up_jobs_take_their_flags_and_refuse_what_they_cannot_run():
    glue = glue_request(parsed("compare", "--glue", "sst2,mrpc", "--glue-max-train-samples", "100",
                               "--glue-max-steps", "5"))
    assert glue.overrides == {"max_steps": 5, "max_train_samples": 100}
    squad = squad_request(parsed("compare", "--squad", "1.1", "--squad-max-length", "384"))
    assert squad.overrides == {"max_steps": None, "max_length": 384}
    with pytest.raises(UsageError, match="--glue-seeds 0 must be at least 1"):
        glue_request(parsed("compare", "--glue", "sst2", "--glue-seeds", "0"))
    with pytest.raises(UsageError, match="give both --squad-train-file and --squad-dev-file"):
        squad_request(parsed("compare", "--squad", "1.1", "--squad-train-file", "train.json"))


def test_help_shows_a_default_only_where_it_is_a_value(capsys):
    """None, False and an empty list mean "unset": no "(default: [])" after --train-file or --set."""
    from convattn.cli import main

    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: [])" not in text and "(default: None)" not in text
    assert "(default: auto)" in text  # --precision's
