"""`convattn glue`: metrics against hand-computed values, recipes, layer-wise lr decay, and end-to-end tiny runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.published import staging_folder_mentions
from helpers.tiny import save_tiny_checkpoint
from transformers import BertConfig, BertForSequenceClassification

from convattn import ConvAttnConfig, ConvAttnForMaskedLM, ConvAttnForSequenceClassification
from convattn.cli import main
from convattn.data.glue import get_task, load_split
from convattn.errors import UsageError
from convattn.training.finetune.optim import layerwise_param_groups
from convattn.training.glue import column_score, load_glue_recipe, resolve_settings, score_predictions, submission_text
from convattn.training.seed_statistics import mean_sem

GLUE_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "glue_data"
FIXTURE_GLUE_DATA = Path(__file__).resolve().parents[2] / "fixtures" / "glue_data"  # tiny, ships with the tests
needs_glue_data = pytest.mark.skipif(not GLUE_DATA.is_dir(), reason=f"shared GLUE data not found at {GLUE_DATA}")
QUICK = ["--seeds", "1", "--max-steps", "3", "--batch-size", "8"]


pytestmark = pytest.mark.usefixtures("one_thread")


def training_sentences() -> list[str]:
    if GLUE_DATA.is_dir():
        lines = (GLUE_DATA / "SST-2" / "train.tsv").read_text().splitlines()[1:4000]
        lines += [line.split("\t")[-1] for line in (GLUE_DATA / "CoLA" / "train.tsv").read_text().splitlines()]
        return [line.split("\t")[0] for line in lines]
    return ["a dog runs in the park .", "the cat sat on the mat .", "nothing moves at all ."] * 50


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A tiny composite-attention MLM checkpoint with a WordPiece tokenizer trained on GLUE sentences."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-composite"), training_sentences())


# ---------------------------------------------------------------- metrics, by hand

def test_classification_metrics_match_hand_computed_values():
    labels, predictions = np.array([1, 0, 0, 1, 1]), np.array([1, 1, 0, 0, 1])
    # TP 2, FP 1, FN 1, TN 1: accuracy 3/5, F1 = 2*2 / (2*2 + 1 + 1), MCC = (2*1 - 1*1) / sqrt(3*3*2*2)
    assert score_predictions(get_task("mrpc"), predictions, labels) == pytest.approx({"accuracy": 60.0,
                                                                                     "f1": 100 * 4 / 6})
    assert score_predictions(get_task("cola"), predictions, labels) == pytest.approx({"mcc": 100 / 6})
    assert score_predictions(get_task("sst2"), predictions, labels) == pytest.approx({"accuracy": 60.0})
    mnli = score_predictions(get_task("mnli"), np.array([0, 1, 2, 2]), np.array([0, 1, 2, 1]))
    assert mnli == pytest.approx({"accuracy": 75.0})


def test_stsb_metrics_match_hand_computed_values():
    # x = 1,2,3 and y = 1,2,4: cov 3, var_x 2, var_y 42/9 -> Pearson 3 / sqrt(2 * 42 / 9); same ranks -> Spearman 1
    scores = score_predictions(get_task("stsb"), np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0]))
    assert scores == pytest.approx({"pearson": 100 * 3 / math.sqrt(2 * 42 / 9), "spearman": 100.0})
    assert column_score(scores) == pytest.approx((scores["pearson"] + scores["spearman"]) / 2)


def test_mean_and_standard_error_of_the_mean():
    stat = mean_sem([1.0, 2.0, 3.0])
    assert stat.pop("values") == [1.0, 2.0, 3.0]  # pytest.approx rejects nested lists since pytest 9.2
    assert stat == pytest.approx({"mean": 2.0, "std": 1.0, "sem": 1 / math.sqrt(3), "n": 3})
    assert mean_sem([5.0]) == {"mean": 5.0, "std": None, "sem": None, "n": 1, "values": [5.0]}


def test_the_best_seed_is_the_highest_mean_score_the_lowest_seed_of_a_tie_and_never_a_nan():
    """The seed whose test predictions go into submission/ and whose model is published: the highest mean of its
    columns; of equal scores the lowest seed (the same choice on every machine); a seed scored NaN never."""
    from convattn.training.glue.results import best_seed

    def runs(scores):
        return {seed: {"scores": {"MRPC": score}} for seed, score in scores.items()}

    assert best_seed(runs({0: 70.0, 1: 72.5, 2: 71.0})) == 1
    assert best_seed(runs({2: 72.5, 0: 70.0, 1: 72.5})) == 1
    assert best_seed(runs({0: math.nan, 1: 60.0})) == 1


def write_finished_run(output_dir, task: str, seed: int, metrics: dict, scores: dict) -> None:
    """The run.json a finished fine-tuning run leaves in runs/<task>/seed<k>/, as `aggregate` reads it."""
    folder = output_dir / "runs" / task / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({
        "task": task, "seed": seed, "model": "m", "init": "pretrained", "settings": {}, "encoder_params": 10,
        "metrics": metrics, "scores": scores, "test_predictions": [], "warnings": []}))


def test_every_dev_split_of_a_task_is_aggregated(tmp_path):
    """MNLI's matched and mismatched dev sets are two columns of one task: each split's metrics over seeds."""
    from convattn.training.glue.results import aggregate

    for seed, (matched, mismatched) in enumerate(((80.0, 81.0), (82.0, 79.0))):
        write_finished_run(tmp_path, "mnli", seed, {"dev_matched": {"accuracy": matched},
                                                    "dev_mismatched": {"accuracy": mismatched}},
                           {"MNLI-m": matched, "MNLI-mm": mismatched})
    metrics = aggregate(tmp_path)["tasks"]["mnli"]["metrics"]
    assert {split: stat["accuracy"]["mean"] for split, stat in metrics.items()} == {"dev_matched": 81.0,
                                                                                     "dev_mismatched": 80.0}


def test_glue_column_is_each_seeds_mean_over_task_columns_then_mean_and_sem_over_seeds(tmp_path):
    """aggregate on synthetic finished runs: three columns (MRPC's the mean of accuracy and F1), seeds 0-2 in every
    task and a seed 3 in one, which the GLUE score leaves out (it has no CoLA or MRPC)."""
    from convattn.training.glue.results import aggregate

    dev = {"cola": {0: {"mcc": 20.0}, 1: {"mcc": 26.0}, 2: {"mcc": 11.0}, 3: {"mcc": 30.0}},
           "sst2": {0: {"accuracy": 80.0}, 1: {"accuracy": 84.0}, 2: {"accuracy": 79.0}},
           "mrpc": {0: {"accuracy": 70.0, "f1": 80.0}, 1: {"accuracy": 68.0, "f1": 81.0},
                    2: {"accuracy": 72.0, "f1": 79.0}}}
    columns = {"cola": "CoLA", "sst2": "SST", "mrpc": "MRPC"}
    for task, seeds in dev.items():
        for seed, metrics in seeds.items():
            write_finished_run(tmp_path, task, seed, {"dev": metrics}, {columns[task]: column_score(metrics)})
    results = aggregate(tmp_path)

    assert results["tasks"]["mrpc"]["metrics"]["dev"]["f1"]["mean"] == pytest.approx(80.0)
    assert results["tasks"]["cola"]["best_seed"] == 3 and results["tasks"]["mrpc"]["best_seed"] == 2
    per_seed = {seed: (dev["cola"][seed]["mcc"] + dev["sst2"][seed]["accuracy"]
                       + (dev["mrpc"][seed]["accuracy"] + dev["mrpc"][seed]["f1"]) / 2) / 3 for seed in (0, 1, 2)}
    glue = results["glue"]
    assert glue["columns"] == ["CoLA", "MRPC", "SST"] and not glue["complete"]
    assert glue["per_seed"] == pytest.approx(per_seed)
    expected = mean_sem(list(per_seed.values()))
    assert (glue["mean"], glue["sem"], glue["n"]) == (pytest.approx(expected["mean"]), pytest.approx(expected["sem"]),
                                                      3)
    assert results["columns"]["CoLA"]["n"] == 4  # the column itself keeps every seed it has


def test_a_training_subset_is_the_same_random_examples_every_time():
    """--max-train-samples (SST-2 on 20,000 of its 67,349 examples, as every model of a study fine-tunes): a fixed
    shuffle's first examples, the same for every model and run, not the file's first lines."""
    from convattn.training.glue.data import read_task_splits

    task = get_task("sst2")
    whole = load_split(task, "train", FIXTURE_GLUE_DATA)["text_a"]
    subsets = [read_task_splits(task, FIXTURE_GLUE_DATA, 20).train["text_a"] for _ in range(2)]
    assert subsets[0] == subsets[1] and len(subsets[0]) == 20 and set(subsets[0]) <= set(whole)
    assert subsets[0] != whole[:20]
    assert read_task_splits(task, FIXTURE_GLUE_DATA, len(whole)).train["text_a"] == whole  # all: the file's order


def test_a_long_pair_is_cut_from_the_longer_side_first():
    """BERT's and ELECTRA's _truncate_seq_pair (transformers' longest_first): a pair over max_length loses tokens
    from whichever side is longer, so a short hypothesis is kept whole and two long sides end about equal."""
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from convattn.training.glue.data import encode

    words = [f"{side}{i}" for side in "ab" for i in range(40)]
    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]")
    pairs = Dataset.from_dict({"text_a": [" ".join(f"a{i}" for i in range(40))] * 2,
                               "text_b": [" ".join(f"b{i}" for i in range(n)) for n in (5, 30)], "label": [0, 1]})
    encoded = encode(pairs, tokenizer, max_length=32, token_types=True)
    kept = [[sum(token.startswith(letter) for token in tokenizer.convert_ids_to_tokens(ids)) for letter in "ab"]
            for ids in encoded["input_ids"]]
    assert kept[0] == [24, 5]  # 29 places after [CLS] and two [SEP]s
    assert sum(kept[1]) == 29 and abs(kept[1][0] - kept[1][1]) <= 1


def test_submission_format():
    rte = submission_text(get_task("rte"), np.array([1, 0]), [0, 1])
    assert rte == "index\tprediction\n0\tnot_entailment\n1\tentailment\n"
    assert submission_text(get_task("stsb"), np.array([-0.2, 5.7, 2.34567]), [0, 1, 2]).splitlines()[1:] == [
        "0\t0.000", "1\t5.000", "2\t2.346"]
    assert submission_text(get_task("cola"), np.array([1]), [9]) == "index\tprediction\n9\t1\n"
    # each index beside its own example's prediction, in the order given
    assert submission_text(get_task("rte"), np.array([0, 1, 1]), [2, 0, 1]).splitlines()[1:] == [
        "2\tentailment", "0\tnot_entailment", "1\tnot_entailment"]


# ---------------------------------------------------------------- recipes and optimizer groups

def test_recipes_follow_the_papers():
    chang = load_glue_recipe("chang2021")
    settings = {t: resolve_settings(chang, t, False, {}, {}, True) for t in ("qnli", "mnli", "rte", "sst2")}
    assert settings["qnli"].learning_rate == 1e-4 and settings["sst2"].learning_rate == 3e-4
    assert (settings["mnli"].batch_size, settings["mnli"].epochs) == (128, 4)
    assert settings["rte"].epochs == 10 and settings["rte"].from_mnli and not settings["sst2"].from_mnli
    assert settings["sst2"].weight_decay == 0 and settings["sst2"].warmup_ratio == 0.1
    assert resolve_settings(chang, "sst2", True, {}, {}, False).learning_rate == 1e-4  # base size
    convbert = resolve_settings(load_glue_recipe("convbert"), "stsb", False, {}, {}, False)
    assert (convbert.layer_decay, convbert.weight_decay, convbert.epochs, convbert.batch_size) == (0.8, 0.01, 10, 32)
    overridden = resolve_settings(chang, "qnli", False, {"learning_rate": 5e-5, "batch_size": None}, {"qnli": 2e-5},
                                  False)
    assert (overridden.learning_rate, overridden.batch_size) == (2e-5, 32)


def lr_by_parameter(model: torch.nn.Module, decay: float) -> tuple[dict[str, float], dict[str, float]]:
    decay_names = {n for n, _ in model.named_parameters() if "LayerNorm" not in n and not n.endswith("bias")}
    groups = layerwise_param_groups(model, 1.0, 0.01, decay, decay_names)
    ids = {id(p): n for n, p in model.named_parameters()}
    lrs = {ids[id(p)]: g["lr"] for g in groups for p in g["params"]}
    wds = {ids[id(p)]: g["weight_decay"] for g in groups for p in g["params"]}
    return lrs, wds


def test_layerwise_decay_on_convattn_names():
    config = ConvAttnConfig.from_preset("chang2021-small/absolute", hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=64, embedding_size=16, vocab_size=50)
    model = ConvAttnForSequenceClassification(config)
    lrs, wds = lr_by_parameter(model, 0.5)
    assert len(lrs) == len(list(model.parameters()))
    # ELECTRA: embeddings (and the E -> H projection) decay^(L+2), layer i decay^(L+1-i), head 1
    assert lrs["convattn.embeddings.word_embeddings.weight"] == 0.5 ** 4
    assert lrs["convattn.embeddings_project.weight"] == 0.5 ** 4
    assert lrs["convattn.encoder.layer.0.attention.self.query.weight"] == 0.5 ** 3
    assert lrs["convattn.encoder.layer.1.output.dense.weight"] == 0.5 ** 2
    assert lrs["classifier.out_proj.weight"] == 1.0
    assert wds["classifier.out_proj.weight"] == 0.01 and wds["classifier.out_proj.bias"] == 0.0
    assert wds["convattn.encoder.layer.1.output.LayerNorm.weight"] == 0.0


def test_layerwise_decay_gives_a_projection_every_layer_shares_the_first_layers_rate():
    # Linformer's layer-wise sharing: one projection under encoder.shared, used from layer 0 on, so it learns at
    # layer 0's rate (not the head's, which a name outside any layer would get)
    config = ConvAttnConfig.from_preset("malard/linformer-n128-k32", hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=64, vocab_size=50,
                                        linformer_sharing="layerwise")
    lrs, _ = lr_by_parameter(ConvAttnForSequenceClassification(config), 0.5)
    shared = [name for name in lrs if ".encoder.shared." in name]
    assert shared and all(lrs[name] == lrs["convattn.encoder.layer.0.attention.self.query.weight"] == 0.5 ** 3
                          for name in shared)


def test_layerwise_decay_on_bert_names():
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=32)
    lrs, _ = lr_by_parameter(BertForSequenceClassification(config), 0.8)
    assert lrs["bert.embeddings.word_embeddings.weight"] == pytest.approx(0.8 ** 5)
    assert lrs["bert.encoder.layer.2.attention.self.query.weight"] == pytest.approx(0.8 ** 2)
    assert lrs["bert.pooler.dense.weight"] == lrs["classifier.weight"] == 1.0


# ---------------------------------------------------------------- end to end

def test_the_fixture_is_in_the_glue_layout():
    counts = {"sst2": {"train": 48, "dev": 16, "test": 12}, "cola": {"train": 48, "dev": 16, "test": 10}}
    for task, splits in counts.items():
        for split, rows in splits.items():
            dataset = load_split(get_task(task), split, FIXTURE_GLUE_DATA)
            assert len(dataset) == rows and ("label" in dataset.column_names) == (split != "test")


@pytest.mark.parametrize("data_dir", [
    pytest.param(FIXTURE_GLUE_DATA, id="fixture"),
    pytest.param(GLUE_DATA, marks=[needs_glue_data, pytest.mark.slow], id="shared-glue-data"),
])
def test_sst2_and_cola_end_to_end_then_resume(tiny_checkpoint, tmp_path, capsys, data_dir):
    out = tmp_path / "out"
    argv = ["glue", "--model", str(tiny_checkpoint), "--task", "sst2,cola", "--data-dir", str(data_dir),
            "--seeds", "2", "--max-steps", "6", "--max-train-samples", "96", "--batch-size", "16",
            "--output-dir", str(out)]
    assert main(argv) == 0

    results = json.loads((out / "glue_results.json").read_text())
    assert set(results["tasks"]) == {"sst2", "cola"}
    for task, column, metric in (("sst2", "SST", "accuracy"), ("cola", "CoLA", "mcc")):
        entry = results["tasks"][task]
        assert entry["seeds"] == [0, 1] and entry["best_seed"] in (0, 1)
        assert entry["settings"]["max_steps"] == 6 and entry["settings"]["max_train_samples"] == 96
        stat = entry["metrics"]["dev"][metric]
        assert stat["n"] == 2 and -100 <= stat["mean"] <= 100 and stat["sem"] is not None
        assert results["columns"][column]["mean"] == pytest.approx(stat["mean"])
    glue = results["glue"]
    assert glue["columns"] == ["CoLA", "SST"] and not glue["complete"]
    runs = [json.loads(marker.read_text()) for marker in out.glob("runs/*/seed*/run.json")]
    assert all(isinstance(run["warnings"], list) for run in runs) and isinstance(results["warnings"], list)
    assert glue["mean"] == pytest.approx((results["columns"]["CoLA"]["mean"] + results["columns"]["SST"]["mean"]) / 2)

    table = (out / "glue_results.md").read_text()
    assert "| Model | Params | CoLA | MNLI-m | MNLI-mm | MRPC | QNLI | QQP | RTE | SST | STS | GLUE |" in table
    assert " ± " in table
    sst_test = (out / "submission" / "SST-2.tsv").read_text().splitlines()
    test_rows = {name: len((data_dir / name / "test.tsv").read_text().splitlines()) for name in ("SST-2", "CoLA")}
    assert sst_test[0] == "index\tprediction" and len(sst_test) == test_rows["SST-2"]  # 1822 on GLUE
    assert sst_test[1].startswith("0\t") and {line.split("\t")[1] for line in sst_test[1:]} <= {"0", "1"}
    assert len((out / "submission" / "CoLA.tsv").read_text().splitlines()) == test_rows["CoLA"]  # 1064 on GLUE
    # the scores and the submission are the shipped model's own predictions (its argmax), recomputed here apart
    # from the job; examples the model nearly ties on are left out (batching moves their logits in the last bits)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    shipped = out / "models" / "sst2"
    classifier = AutoModelForSequenceClassification.from_pretrained(shipped).eval()
    tokenizer = AutoTokenizer.from_pretrained(shipped)

    def predicted(sentences: list[str]) -> tuple[list[int], list[bool]]:
        with torch.no_grad():
            logits = classifier(**tokenizer(sentences, padding=True, return_tensors="pt")).logits
        return logits.argmax(-1).tolist(), ((logits[:, 1] - logits[:, 0]).abs() > 1e-4).tolist()

    test_sentences = [line.split("\t")[1] for line in (data_dir / "SST-2" / "test.tsv").read_text().splitlines()[1:]]
    mine, clear = predicted(test_sentences)
    submitted = [int(line.split("\t")[1]) for line in sst_test[1:]]
    assert sum(clear) > len(clear) // 2
    assert [p for p, c in zip(mine, clear, strict=True) if c] == [p for p, c in zip(submitted, clear, strict=True) if c]
    dev_rows = [line.split("\t") for line in (data_dir / "SST-2" / "dev.tsv").read_text().splitlines()[1:]]
    mine, clear = predicted([sentence for sentence, _ in dev_rows])
    accuracy = 100 * np.mean([p == int(label) for p, (_, label) in zip(mine, dev_rows, strict=True)])
    best = str(results["tasks"]["sst2"]["best_seed"])
    assert results["tasks"]["sst2"]["runs"][best]["dev"]["accuracy"] == pytest.approx(
        accuracy, abs=100 * clear.count(False) / len(dev_rows) + 1e-9)

    log = json.loads((out / "runs" / "sst2" / "seed1" / "log.json").read_text())
    assert any("loss" in entry for entry in log)

    # each task's best dev seed is a model to ship; the other seeds keep no model
    assert "models:" in capsys.readouterr().out
    for task in ("sst2", "cola"):
        record = json.loads((out / "models" / task / "fine_tuned.json").read_text())
        assert record["seed"] == results["tasks"][task]["best_seed"]
        assert not list(out.glob(f"runs/{task}/seed*/model"))
        card = (out / "models" / task / "README.md").read_text()
        assert "pipeline_tag: text-classification" in card and f"# {task}: {task}\n" in card and "dev " in card
        assert f"- name: {task}\n" in card and repr(str(out / "models" / task)) in card  # the final folder
        assert staging_folder_mentions(out / "models" / task) == []
    from transformers import pipeline

    classify = pipeline("text-classification", model=str(out / "models" / "sst2"), device="cpu")
    assert classify("a charming , funny film .")[0]["label"] in ("negative", "positive")
    assert pipeline("text-classification", model=str(out / "models" / "cola"), device="cpu")(
        "the cat sat .")[0]["label"] in ("unacceptable", "acceptable")

    # resume: only the interrupted run (no run.json) is done again
    markers = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/seed*/run.json")}
    interrupted = out / "runs" / "cola" / "seed1" / "run.json"
    interrupted.unlink()
    capsys.readouterr()
    assert main(argv) == 0
    printed = capsys.readouterr().err
    assert "sst2: all 2 seeds already finished" in printed and "cola seed 1: fine-tuning" in printed
    # the finished seed a rerun reuses is named (issue 66: reused without a word)
    assert f"cola: seed 0 already finished in {out}, reused as they are" in printed and "training seed 1" in printed
    assert "cola seed 0: fine-tuning" not in printed
    assert printed.index("cola: seed 0 already finished") < printed.index("cola seed 1: fine-tuning")  # said first
    assert interrupted.is_file()
    assert all(p.stat().st_mtime_ns == t for p, t in markers.items() if p != interrupted)

    # the same output dir with other settings is refused rather than mixed
    assert main([*argv, "--lr", "1e-3"]) == 2
    assert "other settings" in capsys.readouterr().err


def test_dev_scores_pair_each_prediction_with_its_own_label(tiny_checkpoint, tmp_path, monkeypatch):
    """Predictions that are right for every dev example score 100 (CoLA's MCC, SST-2's accuracy): the job pairs
    each prediction with its own example's label. A tiny model cannot show it: it gives every example one class."""
    from transformers.trainer_utils import PredictionOutput

    from convattn.training.finetune.optim import LayerDecayTrainer

    def right(self, dataset, *args, **kwargs):  # logits favouring each example's own label (test sets: class 0)
        labels = np.asarray(dataset["label"]) if "label" in dataset.column_names else np.zeros(len(dataset), int)
        return PredictionOutput(predictions=np.eye(2)[labels] * 3.0 - 1.0, label_ids=None, metrics={})

    monkeypatch.setattr(LayerDecayTrainer, "predict", right)
    out = tmp_path / "out"
    assert main(["glue", "--model", str(tiny_checkpoint), "--task", "sst2,cola", "--data-dir", str(FIXTURE_GLUE_DATA),
                 "--seeds", "1", "--max-steps", "2", "--batch-size", "8", "--output-dir", str(out)]) == 0
    tasks = json.loads((out / "glue_results.json").read_text())["tasks"]
    assert tasks["sst2"]["runs"]["0"]["dev"] == {"accuracy": 100.0} and tasks["cola"]["runs"]["0"]["dev"] == {
        "mcc": 100.0}


def write_fake_pair_task(root: Path, folder: str, header: list[str], label_column: str, labels: list[str],
                         dev_files: tuple[str, ...], test_files: tuple[str, ...]) -> None:
    """A few rows in the GLUE TSV layout of a pair task (MNLI, RTE, STS-B are not in ../shared)."""
    (root / folder).mkdir(parents=True)
    pairs = [("a dog runs in the park .", "an animal moves ."), ("the cat sat on the mat .", "nothing moves ."),
             ("it 's a charming journey .", "the film is good ."), ("the sailors rode the breeze .", "a boat .")]

    def rows(n: int, labelled: bool) -> str:
        lines = ["\t".join(header if labelled else [c for c in header if c != label_column])]
        for i in range(n):
            values = {"index": str(i), "sentence1": pairs[i % 4][0], "sentence2": pairs[i % 4][1],
                      label_column: labels[i % len(labels)]}
            lines.append("\t".join(values.get(c, "x") for c in header if labelled or c != label_column))
        return "\n".join(lines) + "\n"

    (root / folder / "train.tsv").write_text(rows(24, True))
    for name in dev_files:
        (root / folder / f"{name}.tsv").write_text(rows(8, True))
    for name in test_files:
        (root / folder / f"{name}.tsv").write_text(rows(5, False))


@pytest.fixture
def fake_glue_data(tmp_path) -> Path:
    root = tmp_path / "glue_data"
    mnli_header = ["index", "promptID", "pairID", "genre", "sentence1", "sentence2", "label1", "gold_label"]
    write_fake_pair_task(root, "MNLI", mnli_header, "gold_label", ["entailment", "neutral", "contradiction"],
                         ("dev_matched", "dev_mismatched"), ("test_matched", "test_mismatched"))
    write_fake_pair_task(root, "RTE", ["index", "sentence1", "sentence2", "label"], "label",
                         ["entailment", "not_entailment"], ("dev",), ("test",))
    write_fake_pair_task(root, "STS-B", ["index", "genre", "sentence1", "sentence2", "score"], "score",
                         ["0.5", "4.2", "3.0", "1.25"], ("dev",), ("test",))
    (root / "diagnostic").mkdir()
    (root / "diagnostic" / "diagnostic.tsv").write_text("index\tsentence1\tsentence2\n0\ta dog .\ta cat .\n"
                                                         "1\tthe cat sat .\tthe cat did not sit .\n")
    return root


def test_from_mnli_and_ax_use_the_same_seeds_mnli_model(tiny_checkpoint, fake_glue_data, tmp_path):
    out = tmp_path / "out"
    argv = ["glue", "--model", str(tiny_checkpoint), "--task", "ax,stsb,rte,mnli", "--data-dir", str(fake_glue_data),
            "--from-mnli", "--output-dir", str(out), *QUICK]
    assert main(argv) == 0
    assert (out / "runs" / "mnli" / "seed0" / "model" / "config.json").is_file()
    runs = {t: json.loads((out / "runs" / t / "seed0" / "run.json").read_text()) for t in ("mnli", "rte", "stsb")}
    assert runs["mnli"]["init"] == "pretrained"
    assert runs["rte"]["init"] == runs["stsb"]["init"] == "mnli seed 0"
    assert set(runs["mnli"]["scores"]) == {"MNLI-m", "MNLI-mm"}
    assert set(runs["stsb"]["metrics"]["dev"]) == {"pearson", "spearman"}

    submission = out / "submission"
    assert {p.name for p in submission.iterdir()} == {"MNLI-m.tsv", "MNLI-mm.tsv", "RTE.tsv", "STS-B.tsv", "AX.tsv"}
    ax = (submission / "AX.tsv").read_text().splitlines()
    assert len(ax) == 3 and {line.split("\t")[1] for line in ax[1:]} <= {"entailment", "neutral", "contradiction"}
    assert {line.split("\t")[1] for line in (submission / "RTE.tsv").read_text().splitlines()[1:]} <= {
        "entailment", "not_entailment"}
    assert all(0 <= float(line.split("\t")[1]) <= 5 for line in (submission / "STS-B.tsv").read_text().splitlines()[1:])
    results = json.loads((out / "glue_results.json").read_text())
    assert results["glue"]["columns"] == ["MNLI-m", "MNLI-mm", "RTE", "STS"]
    assert results["submission"]["AX.tsv"] == "ax seed 0"


def test_from_mnli_without_mnli_runs_is_refused(tiny_checkpoint, fake_glue_data, tmp_path, capsys):
    argv = ["glue", "--model", str(tiny_checkpoint), "--task", "rte", "--data-dir", str(fake_glue_data),
            "--from-mnli", "--output-dir", str(tmp_path / "out"), *QUICK]
    assert main(argv) == 2
    assert "add mnli to --task" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused inside the folder's lock: nothing written, no folder left


@pytest.mark.parametrize(("extra", "message"), [
    (["--task", "sst", "--data-dir", "."], "unknown GLUE task 'sst'"),
    (["--task", "rte", "--data-dir", "/nonexistent/glue_data"], "is not a directory"),
    (["--task", "qqp", "--data-dir", "{data}"], "no qqp train data"),
    (["--task", "rte", "--data-dir", "{data}", "--task-lr", "rte:1e-4"], "--task-lr expects TASK=LR"),
    (["--task", "rte", "--data-dir", "{data}", "--recipe", "convbert", "--warmup-ratio", "1.5"],
     "--warmup-ratio 1.5 must be"),
])
def test_usage_errors_exit_2(tiny_checkpoint, fake_glue_data, tmp_path, capsys, extra, message):
    extra = [arg.replace("{data}", str(fake_glue_data)) for arg in extra]
    argv = ["glue", "--model", str(tiny_checkpoint), "--output-dir", str(tmp_path / "out"), *QUICK, *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("convattn glue: error:") and message in err and len(err.strip().splitlines()) == 1


def test_hub_unavailable_exits_2_with_a_hint(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    argv = ["glue", "--model", str(tiny_checkpoint), "--task", "sst2", "--output-dir", str(tmp_path / "out"), *QUICK]
    assert main(argv) == 2
    assert "pass --data-dir" in capsys.readouterr().err


def test_two_models_with_one_folder_name_get_their_own_results(tmp_path):
    from convattn.commands.fine_tune_flags import model_output_dir
    from convattn.training.finetune.pretrained import check_same_model

    first, second = tmp_path / "a" / "discriminator", tmp_path / "b" / "discriminator"
    for seed, folder in enumerate((first, second)):
        torch.manual_seed(seed)
        ConvAttnForMaskedLM(ConvAttnConfig.from_preset("chang2021-small/composite", num_hidden_layers=1,
                                                       hidden_size=32, intermediate_size=64,
                                                       vocab_size=50)).save_pretrained(folder)
    assert model_output_dir("glue", str(first)) != model_output_dir("glue", str(second))
    assert model_output_dir("glue", str(first)).name.startswith("discriminator-")
    out = tmp_path / "glue"
    check_same_model(out, str(first), "glue_model.json")
    check_same_model(out, str(first), "glue_model.json")  # the same model again: its finished runs are reused
    (out / "runs" / "sst2" / "seed0").mkdir(parents=True)
    (out / "runs" / "sst2" / "seed0" / "run.json").write_text("{}")  # a finished run of the first model
    with pytest.raises(UsageError, match="holds 1 finished run"):
        check_same_model(out, str(second), "glue_model.json")


def test_a_folder_holding_the_users_results_is_refused_and_left_alone(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "mine"
    (out / "submission").mkdir(parents=True)
    (out / "glue_results.md").write_text("my table")
    (out / "submission" / "SST-2.tsv").write_text("index\tprediction\n0\t1\n")
    argv = ["glue", "--model", str(tiny_checkpoint), "--task", "sst2", "--data-dir", str(FIXTURE_GLUE_DATA),
            "--output-dir", str(out), *QUICK]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("convattn glue: error: --output-dir")
    assert "glue_results.md, submission/" in err and "did not write" in err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["glue_results.md", "submission",
                                                                       "submission/SST-2.tsv"]
    assert (out / "glue_results.md").read_text() == "my table"


def test_a_model_rewritten_between_seeds_never_mixes_into_one_table(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import shutil

    from helpers.finetune import rewriting_the_model_after

    from convattn.training.glue import job

    model, out = tmp_path / "model", tmp_path / "out"
    shutil.copytree(tiny_checkpoint, model)
    monkeypatch.setattr(job, "fine_tune", rewriting_the_model_after(job.fine_tune, model))
    argv = ["glue", "--model", str(model), "--task", "sst2", "--data-dir", str(FIXTURE_GLUE_DATA),
            "--output-dir", str(out), *QUICK, "--seeds", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("convattn glue: error: --model") and "changed while this job ran" in err
    assert (out / "runs" / "sst2" / "seed0" / "run.json").is_file()
    assert not (out / "runs" / "sst2" / "seed1" / "run.json").exists() and not (out / "glue_results.json").exists()
