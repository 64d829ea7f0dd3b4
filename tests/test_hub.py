"""Saved models load with trust_remote_code where convattn cannot be imported; model card; push."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from helpers.remote import run_without_convattn
from helpers.tiny import randomize_, tiny_config, tiny_wordpiece_tokenizer
from safetensors.torch import load_file, save_file

from convattn import ConvAttnForMaskedLM
from convattn.remote_code import AUTO_MAP

LOAD_AND_RUN = textwrap.dedent('''
    import sys, traceback, torch
    from safetensors.torch import load_file, save_file
    from transformers import (AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification,
                              AutoTokenizer)

    torch.set_num_threads(1)  # as the test process: a product split across threads sums in another order

    def load_and_run(model_dir, out):
        ids = load_file(model_dir + "/inputs.safetensors")
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=True)
        assert type(config).__name__ == "ConvAttnConfig", type(config)
        outputs = {}
        for name, auto in (("mlm", AutoModelForMaskedLM), ("base", AutoModel)):
            model = auto.from_pretrained(model_dir, trust_remote_code=True).eval()
            with torch.no_grad():
                outputs[name] = model(**ids).to_tuple()[0]
        classifier = AutoModelForSequenceClassification.from_pretrained(model_dir, trust_remote_code=True,
                                                                        num_labels=3)
        assert type(classifier).__name__ == "ConvAttnForSequenceClassification"
        # a model loaded from the bundle saves the bundle again, and the copy loads too
        model = AutoModelForMaskedLM.from_pretrained(model_dir, trust_remote_code=True).eval()
        model.save_pretrained(out + ".again")
        again = AutoModelForMaskedLM.from_pretrained(out + ".again", trust_remote_code=True).eval()
        with torch.no_grad():
            outputs["again"] = again(**ids).logits
        # the tokenizer alone, without running the model's code (transformers reads config.json first)
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
        assert tokenizer.is_fast and tokenizer.mask_token == "[MASK]"
        assert "convattn" not in sys.modules
        save_file(outputs, out)

    # (model folder, output file) pairs: one process for them all (each start imports transformers' models, seconds);
    # a folder that fails leaves its traceback beside its output for its own test to show
    for model_dir, out in zip(sys.argv[1::2], sys.argv[2::2], strict=True):
        try:
            load_and_run(model_dir, out)
        except Exception:
            open(out + ".error", "w").write(traceback.format_exc())
''')


def test_the_blocker_really_hides_convattn(tmp_path):
    result = run_without_convattn(tmp_path, "import convattn\n")
    assert result.returncode != 0 and "No module named 'convattn'" in result.stderr


REMOTE_PRESETS = ["chang2021-small/composite+conv-qkv", "chang2021-small/convbert", "malard/conv-linformer-n128-k32",
                  "chang2021-small/composite+rotary", "chang2021-small/alibi"]


def saved_preset(preset: str, folder):
    """The randomised tiny model of `preset`, saved with a tokenizer and its inputs into `folder`; the model and
    its inputs."""
    torch.manual_seed(0)
    model = ConvAttnForMaskedLM(tiny_config(preset))
    randomize_(model)
    model.eval()
    model.save_pretrained(folder)
    tiny_wordpiece_tokenizer(["the cat sat on the mat", "a dog ran"], vocab_size=60).save_pretrained(folder)
    ids = torch.randint(5, 101, (2, 13))
    keep = torch.ones_like(ids)
    keep[1, 9:] = 0
    save_file({"input_ids": ids, "attention_mask": keep}, folder / "inputs.safetensors")
    return model, ids, keep


@pytest.fixture(scope="module")
def remote_runs(tmp_path_factory):
    """Every preset of REMOTE_PRESETS saved, then loaded and run in ONE process that cannot import convattn: per
    preset, its model, inputs, folder and the output file that process wrote (or a `.error` file beside it)."""
    root = tmp_path_factory.mktemp("remote")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bit for bit: both processes on one thread
    try:
        runs, args = {}, []
        for index, preset in enumerate(REMOTE_PRESETS):
            folder = root / f"model{index}"  # one folder name each: remote code is cached under it
            out = root / f"out{index}.safetensors"
            runs[preset] = (*saved_preset(preset, folder), folder, out)
            args += [str(folder), str(out)]
        result = run_without_convattn(root, LOAD_AND_RUN, *args)
    finally:
        torch.set_num_threads(threads)
    return runs, result


@pytest.mark.parametrize("preset", REMOTE_PRESETS)
@pytest.mark.slow
def test_saved_model_loads_and_reproduces_logits_without_convattn(preset, remote_runs, one_thread):
    """Bit for bit: both processes run the same code on one thread each (with the machine's thread count in one
    and a single thread in the other, the logits had differed in the 5th digit on a 2-core machine)."""
    runs, result = remote_runs
    model, ids, keep, folder, out = runs[preset]
    error = out.with_name(out.name + ".error")
    assert result.returncode == 0 and not error.exists(), (error.read_text() if error.exists() else
                                                           result.stderr[-3000:])
    assert json.loads((folder / "config.json").read_text())["auto_map"]["AutoModelForMaskedLM"] == (
        "convattn_model.ConvAttnForMaskedLM")
    remote = load_file(out)
    with torch.no_grad():
        assert torch.equal(remote["mlm"], model(input_ids=ids, attention_mask=keep).logits)
        assert torch.equal(remote["again"], remote["mlm"])
        assert torch.equal(remote["base"], model.convattn(input_ids=ids, attention_mask=keep).last_hidden_state)


def test_every_auto_class_in_the_map_exists():
    import importlib

    import transformers

    for auto, (module, cls) in AUTO_MAP.items():
        assert hasattr(transformers, auto)
        assert hasattr(importlib.import_module(module), cls)


def test_the_card_names_the_training_data_as_the_run_gave_it():
    from convattn.hub import training_data

    assert training_data({"dataset": "Salesforce/wikitext", "dataset_config": "wikitext-103-raw-v1"}) == \
        "Salesforce/wikitext (HuggingFace hub, wikitext-103-raw-v1)"
    files = {"dataset": None, "train_files": ["corpus/wiki/", "books/*.txt"]}
    assert training_data(files) == "corpus/wiki/, books/*.txt"
    assert "embedded default" in training_data({"dataset": None, "train_files": []})
    assert training_data({}) == "not recorded"


def test_the_card_lists_config_fields_with_their_values(tmp_path):
    """The fields a card lists are ConvAttnConfig's (a field renamed there shows here), each with the value the run's
    config.json holds, sizes first."""
    import dataclasses

    from convattn.config import ConvAttnConfig
    from convattn.hub import CARD_MECHANISM, CARD_SIZES, model_card

    assert set(CARD_SIZES + CARD_MECHANISM) <= {f.name for f in dataclasses.fields(ConvAttnConfig)}
    config = tiny_config("chang2021-small/composite")
    config.save_pretrained(tmp_path)
    listed = [line for line in model_card(tmp_path).splitlines() if line.startswith("- `")]
    assert listed == [f"- `{name}`: {json.dumps(config.to_dict()[name])}" for name in CARD_SIZES + CARD_MECHANISM]


def test_the_cards_metadata_holds_what_the_run_knows_and_nothing_empty(tmp_path):
    """An ELECTRA run stopped at step 8 of 100, trained on a Hub dataset: no fill-mask pipeline tag (its head is
    not a masked LM), the dataset listed, the last evaluation's step and perplexity, the repository it goes to."""
    import yaml

    from convattn.hub import model_card
    from convattn.runs.pretrain import METRICS_FILE, OPTIONS_FILE

    config = tiny_config("convbert/small")
    config.architectures = ["ConvAttnForPreTraining"]
    config.save_pretrained(tmp_path)
    (tmp_path / OPTIONS_FILE).write_text(json.dumps({"dataset": "Salesforce/wikitext", "max_steps": 100}))
    rows = [{"step": step, "perplexity": 900.0 - step, "tokens_seen": 512 * step} for step in (0, 4, 8)]
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    card = model_card(tmp_path, "someone/electra-tiny")
    metadata = yaml.safe_load(card.split("---")[1])
    assert "pipeline_tag" not in metadata and None not in metadata.values()
    assert metadata["datasets"] == ["Salesforce/wikitext"]
    assert metadata["model-index"][0]["name"] == "someone/electra-tiny"
    assert metadata["model-index"][0]["results"][0]["metrics"][0]["value"] == 892.0
    assert "- steps: 8\n" in card and "- tokens seen: 4,096\n" in card and "`ConvAttnForPreTraining`" in card
    (tmp_path / OPTIONS_FILE).write_text(json.dumps({"dataset": None, "train_files": ["a.txt"]}))
    assert "datasets" not in yaml.safe_load(model_card(tmp_path).split("---")[1])


RESAVE_PRETRAINING = textwrap.dedent('''
    import sys, torch
    from transformers import (AutoModel, AutoModelForPreTraining, AutoModelForSequenceClassification, Trainer,
                              TrainingArguments)

    model_dir, out = sys.argv[1], sys.argv[2]
    # as sentence-transformers re-saves (AutoModel), as a fine-tuning Trainer does, as ELECTRA's own Trainer does;
    # the bundle's own class last: loading it first would copy its file for the others
    AutoModel.from_pretrained(model_dir, trust_remote_code=True).save_pretrained(out + "/base")
    for name, auto in (("classifier", AutoModelForSequenceClassification), ("electra", AutoModelForPreTraining)):
        model = auto.from_pretrained(model_dir, trust_remote_code=True)
        Trainer(model=model, args=TrainingArguments(out + ".trainer", report_to="none")).save_model(out + "/" + name)
    for name in ("base", "classifier", "electra"):
        again = AutoModelForPreTraining.from_pretrained(out + "/" + name, trust_remote_code=True)
        assert type(again).__name__ == "ConvAttnForPreTraining", name
    assert "convattn" not in sys.modules
''')


@pytest.mark.slow
def test_an_electra_model_resaved_however_it_was_loaded_keeps_the_whole_bundle(tmp_path):
    from convattn.electra import ConvAttnForPreTraining

    config = tiny_config("convbert/small")
    config.mask_token_id = 4
    ConvAttnForPreTraining(config).save_pretrained(tmp_path / "electra")
    bundle = {path.name for path in (tmp_path / "electra").glob("*.py")}
    result = run_without_convattn(tmp_path, RESAVE_PRETRAINING, str(tmp_path / "electra"), str(tmp_path / "resaved"))
    assert result.returncode == 0, result.stderr[-2000:]
    for name in ("base", "classifier", "electra"):
        assert {path.name for path in (tmp_path / "resaved" / name).glob("*.py")} == bundle, name  # and no other
