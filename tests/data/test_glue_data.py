"""GLUE task registry and loaders: the real TSV files in ../shared and each task's layout quirks."""

from __future__ import annotations

from pathlib import Path

import pytest

from convattn.data import glue
from convattn.data.glue import TASKS, get_task, load_split, parse_task_list
from convattn.errors import UsageError

GLUE_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "glue_data"
needs_glue_data = pytest.mark.skipif(not GLUE_DATA.is_dir(), reason=f"shared GLUE data not found at {GLUE_DATA}")


def write_tsv(path: Path, rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(row) + "\n" for row in rows))


def test_registry_uses_hub_names_and_orders_mnli_first():
    assert set(TASKS) == {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "ax"}
    assert parse_task_list("all")[0] == "mnli"
    assert parse_task_list("RTE, mnli,ax") == ["mnli", "rte", "ax"]
    assert get_task("stsb").is_regression and get_task("stsb").num_labels == 1
    assert get_task("mnli").num_labels == 3 and not get_task("ax").trains


# class index -> name, as the hub's nyu-mll/glue features name them (the TSV files hold the indices as "0"/"1")
HUB_CLASS_NAMES = {
    "cola": ["unacceptable", "acceptable"], "sst2": ["negative", "positive"],
    "mrpc": ["not_equivalent", "equivalent"], "qqp": ["not_duplicate", "duplicate"],
    "mnli": ["entailment", "neutral", "contradiction"], "ax": ["entailment", "neutral", "contradiction"],
    "qnli": ["entailment", "not_entailment"], "rte": ["entailment", "not_entailment"],
    "wnli": ["not_entailment", "entailment"],
}


def test_every_classification_task_names_its_classes_as_the_hub_does():
    for name, task in TASKS.items():
        if task.is_regression:
            assert task.id2label == {0: "score"}
            continue
        assert list(task.id2label.values()) == HUB_CLASS_NAMES[name], name
        assert len(task.id2label) == task.num_labels
        assert task.label2id == {label: index for index, label in task.id2label.items()}


def test_unknown_task_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown GLUE task 'sst'"):
        parse_task_list("sst")


@needs_glue_data
def test_cola_train_and_dev_have_no_header_test_has_one():
    cola = get_task("cola")
    train, dev, test = (load_split(cola, split, GLUE_DATA) for split in ("train", "dev", "test"))
    assert (len(train), len(dev), len(test)) == (8551, 1043, 1063)
    assert train[0] == {"text_a": "Our friends won't buy this analysis, let alone the next one we propose.",
                        "idx": 0, "label": 1}
    assert set(dev["label"]) == {0, 1}
    assert "label" not in test.column_names and test[0] == {"text_a": "Bill whistled past the house.", "idx": 0}


@needs_glue_data
def test_mrpc_columns_and_bom():
    mrpc = get_task("mrpc")
    dev = load_split(mrpc, "dev", GLUE_DATA)
    assert len(dev) == 408 and dev.column_names == ["text_a", "text_b", "idx", "label"]
    assert dev[0]["text_a"].startswith("He said the foodservice pie business") and dev[0]["label"] == 1
    assert dev[1]["text_b"].startswith("His wife said he was") and dev[1]["label"] == 0  # a bare quote in the text
    test = load_split(mrpc, "test", GLUE_DATA)
    assert len(test) == 1725 and test["idx"][:3] == [0, 1, 2]


@needs_glue_data
def test_sst2_qnli_wnli_and_diagnostic():
    assert len(load_split(get_task("sst2"), "dev", GLUE_DATA)) == 872
    qnli = load_split(get_task("qnli"), "dev", GLUE_DATA)
    assert len(qnli) == 5463 and qnli[0]["label"] == 0 and qnli[1]["label"] == 1  # entailment, not_entailment
    assert set(load_split(get_task("wnli"), "train", GLUE_DATA)["label"]) == {0, 1}
    ax = load_split(get_task("ax"), "test", GLUE_DATA)
    assert len(ax) == 1104 and ax[0]["text_b"] == "The cat did not sit on the mat."


def test_stsb_qqp_mnli_layouts(tmp_path):
    write_tsv(tmp_path / "STS-B" / "dev.tsv", [
        ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"],
        ["0", "main-captions", "MSRvid", "2012test", "0000", "none", "none", "A man plays.", "A man is playing.",
         "4.8"],
    ])
    write_tsv(tmp_path / "QQP" / "test.tsv", [["id", "question1", "question2"], ["7", "Why?", "Why not?"]])
    header = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
              "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
    write_tsv(tmp_path / "MNLI" / "dev_mismatched.tsv", [
        header, ["0", "1", "1n", "letters", "(", "(", "(", "(", "A dog runs.", "An animal moves.", "x", "entailment"],
        ["1", "2", "2c", "letters", "(", "(", "(", "(", "A dog runs.", "Nothing moves.", "x", "contradiction"],
    ])
    sts = load_split(get_task("stsb"), "dev", tmp_path)
    assert sts[0]["label"] == pytest.approx(4.8) and sts[0]["text_b"] == "A man is playing."
    assert load_split(get_task("qqp"), "test", tmp_path)[0] == {"text_a": "Why?", "text_b": "Why not?", "idx": 7}
    mnli = load_split(get_task("mnli"), "dev_mismatched", tmp_path)
    assert mnli["label"] == [0, 2] and mnli[1]["text_b"] == "Nothing moves."


def test_bad_label_and_missing_file_name_the_file(tmp_path):
    write_tsv(tmp_path / "RTE" / "train.tsv", [["index", "sentence1", "sentence2", "label"], ["0", "a", "b", "maybe"]])
    with pytest.raises(ValueError, match=r"RTE/train\.tsv:2: unknown rte label 'maybe'"):
        load_split(get_task("rte"), "train", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"RTE/dev\.tsv does not exist"):
        load_split(get_task("rte"), "dev", tmp_path)


def test_hub_failure_tells_the_user_to_pass_data_dir(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UsageError, match=r"nyu-mll/glue.*pass `data_dir`"):
        glue.load_split(get_task("sst2"), "dev", None)


@pytest.mark.parametrize(("text", "needle"), [
    ("sentence\tlabel\n", "has no data rows"),
    ("sentence\tlabel\na fine film .\t1\textra\n", ":2: 3 tab-separated columns, expected 2"),
    ("sentence\tlabel\na film with no label .\n", ":2: 1 tab-separated columns, expected 2"),
])
def test_empty_or_misshapen_tsv_is_one_clear_error(tmp_path, text, needle):
    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "train.tsv").write_text(text)
    with pytest.raises(ValueError, match=needle):
        load_split(get_task("sst2"), "train", tmp_path)


STSB_HEADER = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
               "score"]


@pytest.mark.parametrize("score", ["99", "-0.5", "nan", "abc"])
def test_an_stsb_score_outside_0_to_5_names_the_line_and_the_range(tmp_path, score):
    rows = [["0", "g", "f", "y", "0", "n", "n", "A man plays.", "A man is playing.", value] for value in ("0", "5")]
    write_tsv(tmp_path / "STS-B" / "train.tsv", [STSB_HEADER, *rows, [*rows[0][:-1], score]])
    with pytest.raises(ValueError, match=rf"STS-B/train\.tsv:4: stsb score '{score}' is not a number from 0 to 5"):
        load_split(get_task("stsb"), "train", tmp_path)
    write_tsv(tmp_path / "STS-B" / "train.tsv", [STSB_HEADER, *rows])
    assert load_split(get_task("stsb"), "train", tmp_path)["label"] == [0.0, 5.0]


def test_a_test_index_given_twice_names_both_lines(tmp_path):
    write_tsv(tmp_path / "SST-2" / "test.tsv", [["index", "sentence"], ["0", "good ."], ["1", "bad ."], ["0", "ok ."]])
    with pytest.raises(ValueError, match=r"SST-2/test\.tsv:4: index 0 is given twice \(first at .*test\.tsv:2\)"):
        load_split(get_task("sst2"), "test", tmp_path)
    write_tsv(tmp_path / "SST-2" / "test.tsv", [["index", "sentence"], ["x", "good ."]])
    with pytest.raises(ValueError, match=r"test\.tsv:2: index 'x' is not a whole number"):
        load_split(get_task("sst2"), "test", tmp_path)


@pytest.mark.parametrize("name", ["mrpc", "mnli"])
def test_hub_splits_take_the_columns_the_tsv_files_do(name, monkeypatch):
    """A hub split becomes what the TSV layout gives: its first sentence text_a, its second text_b, its index and
    label kept, and a test split's labels (all -1 on the hub) dropped."""
    from datasets import Dataset

    first, second = get_task(name).hub_text_columns

    def hub(dataset, config, split):
        assert (dataset, config) == ("nyu-mll/glue", name)
        return Dataset.from_dict({second: ["An animal moves."], "label": [1], first: ["A dog runs."], "idx": [5]})

    monkeypatch.setattr(glue, "load_hub_dataset", hub)
    dev_split = "dev" if name == "mrpc" else "dev_matched"
    assert load_split(get_task(name), dev_split, None)[0] == {"text_a": "A dog runs.", "text_b": "An animal moves.",
                                                              "idx": 5, "label": 1}
    test = load_split(get_task(name), dev_split.replace("dev", "test"), None)
    assert test.column_names == ["text_a", "text_b", "idx"]
