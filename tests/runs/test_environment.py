"""environment.jsonl: what each start of a run trained on, what a resume says changed, and the card's lines."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from convattn.hub import environment_lines
from convattn.runs.environment import (
    ENVIRONMENT_FILE,
    SOURCE,
    changes,
    code_change,
    describe,
    environment,
    files_digest,
    mixed_code_warning,
    record_environment,
    recorded_environments,
    source_digest,
)
from convattn.training.pretrain.job import note_environment


def test_the_record_names_device_threads_and_the_thread_variables_set(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    entry = environment(torch.device("cpu"), processes=1, precision="fp32")
    assert entry["device"] == "cpu" and entry["threads"] == torch.get_num_threads()
    assert entry["thread_variables"] == {"OMP_WAIT_POLICY": "PASSIVE", **{
        name: entry["thread_variables"][name] for name in ("OMP_NUM_THREADS", "KMP_BLOCKTIME", "MKL_NUM_THREADS")
        if name in entry["thread_variables"]}}
    assert entry["torch"] == torch.__version__ and entry["device_name"]
    json.dumps(entry)  # one JSON line


def test_the_record_keeps_the_processes_precision_and_every_thread_variable_set(monkeypatch):
    """What the run was given, not a default: a bf16 run of 3 processes recorded as 1 process of fp32 would put its
    times beside another setting's; each of the thread variables moves a CPU time."""
    values = {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "1000", "KMP_BLOCKTIME": "0",
              "MKL_NUM_THREADS": "2"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    entry = environment(torch.device("cpu"), processes=3, precision="bf16")
    assert (entry["processes"], entry["precision"], entry["thread_variables"]) == (3, "bf16", values)


@pytest.mark.parametrize(("key", "old", "new"), [
    ("device", "cpu", "cuda"), ("device_name", "Test CPU", "Other CPU"), ("threads", 2, 4), ("processes", 1, 2),
    ("precision", "fp32", "bf16"), ("denormals", "kept", "flushed"), ("torch", "2.13.0", "2.14.0"),
    ("transformers", "5.0", "5.1"), ("convattn", "0.1.0", "0.2.0"),
])
def test_a_resume_names_each_setting_that_moves_a_time(key, old, new):
    """Each setting a resume compares, named as it moved: one left out would let a resume in bf16, or under other
    library versions, pass as the same setting."""
    before = fake_start(2, {}) | {"denormals": "kept", key: old}
    assert changes(before, before | {key: new}) == [f"{key.replace('_', ' ')} {old} -> {new}"]


def test_changes_name_each_setting_that_moves_a_time_and_nothing_else():
    before = dict(device="cpu", threads=2, precision="fp32", thread_variables={"OMP_WAIT_POLICY": "PASSIVE"},
                  load_average=0.1, torch="2.13.0")
    after = dict(before, threads=4, load_average=3.0, thread_variables={"GOMP_SPINCOUNT": "1000"})
    assert changes(before, after) == ["threads 2 -> 4", "GOMP_SPINCOUNT unset -> 1000",
                                      "OMP_WAIT_POLICY PASSIVE -> unset"]
    assert changes(before, dict(before, load_average=5.0)) == []  # the load is recorded, not a setting
    older = {key: value for key, value in before.items() if key != "thread_variables"}  # a record without them
    assert changes(older, dict(older, thread_variables={"GOMP_SPINCOUNT": "1000"})) == ["GOMP_SPINCOUNT unset -> 1000"]
    assert changes({}, {"precision": "bf16"}) == ["precision not recorded -> bf16"]  # a record from before the field


def test_lines_are_appended_and_a_damaged_line_is_skipped(tmp_path):
    record_environment(tmp_path, 0, {"threads": 2})
    with open(tmp_path / ENVIRONMENT_FILE, "a", encoding="utf-8") as f:
        f.write('{"step": 4, "thr')  # a kill while appending
    record_environment(tmp_path, 8, {"threads": 4})
    entries = recorded_environments(tmp_path)
    assert [(e["step"], e["threads"]) for e in entries] == [(0, 2), (8, 4)]
    assert all(e["started"].endswith("+00:00") for e in entries)


def test_the_code_digest_follows_the_code_files_paths_and_bytes_and_nothing_else(tmp_path):
    package = tmp_path / "package"
    (package / "configs").mkdir(parents=True)
    (package / "__pycache__").mkdir()
    (package / "model.py").write_text("SCALE = 1.0\n")
    (package / "configs" / "recipe.yaml").write_text("lr: 3e-4\n")
    (package / "configs" / "grid.json").write_text('{"seeds": 3}\n')
    digest = files_digest(package)
    assert len(digest) == 12 and files_digest(package) == digest
    (package / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"compiled")
    (package / "notes.txt").write_text("not code")
    assert files_digest(package) == digest
    for change in (lambda: (package / "model.py").write_text("SCALE = 2.0\n"),
                   lambda: (package / "configs" / "recipe.yaml").write_text("lr: 1e-4\n"),
                   lambda: (package / "configs" / "grid.json").write_text('{"seeds": 5}\n'),
                   lambda: (package / "configs" / "recipe.yaml").rename(package / "configs" / "other.yaml")):
        change()
        assert files_digest(package) != digest
        digest = files_digest(package)
    assert environment(torch.device("cpu"), processes=1, precision="fp32")[SOURCE] == source_digest()


def test_a_code_change_is_named_where_both_records_have_the_digest():
    assert code_change({SOURCE: "aaa"}, {SOURCE: "bbb"}) == "convattn code aaa -> bbb"
    assert code_change({SOURCE: "aaa"}, {SOURCE: "aaa"}) is None
    assert code_change({}, {SOURCE: "bbb"}) is None  # a record from before the digest: unknown, not a change
    assert changes({SOURCE: "aaa"}, {SOURCE: "bbb"}) == []  # a setting that moves times is another thing
    assert describe(fake_start(2, {}, code="aaa")).endswith("convattn 0.1.0 (code aaa), load average 0.5 at the start")


def test_results_of_runs_from_different_code_are_warned_about():
    assert mixed_code_warning([("sst2 seed 0", {SOURCE: "aaa"}), ("cola seed 0", {SOURCE: "aaa"})]) is None
    assert "(code aaa: sst2 seed 0; code bbb: sst2 seed 1)" in mixed_code_warning([("sst2 seed 0", {SOURCE: "aaa"}),
                                                                                ("sst2 seed 1", {SOURCE: "bbb"})])
    warning = mixed_code_warning([("sst2 seed 0", {SOURCE: "aaa"}), ("sst2 seed 1", {SOURCE: "bbb"}),
                                  ("cola seed 0", {}), ("cola seed 1", {SOURCE: "aaa"})])
    assert ("(code aaa: sst2 seed 0, cola seed 1; code bbb: sst2 seed 1; code not recorded: cola seed 0)"
            in warning)


def fake_start(threads: int, variables: dict, code: str | None = None) -> dict:
    return dict(device="cpu", device_name="Test CPU", cpu_cores=2, threads=threads, processes=1, precision="fp32",
                thread_variables=variables, load_average=0.5, torch="2.13.0", transformers="5.0", convattn="0.1.0",
                **({SOURCE: code} if code else {}))


@pytest.mark.parametrize("moved", [False, True])
def test_a_resume_says_what_moved_and_the_card_lists_it(moved, tmp_path, monkeypatch, capsys):
    from convattn.training.pretrain import job

    first = fake_start(2, {"OMP_WAIT_POLICY": "PASSIVE"})
    record_environment(tmp_path, 0, first)
    now = fake_start(4 if moved else 2, {"OMP_WAIT_POLICY": "PASSIVE"})
    monkeypatch.setattr(job, "environment", lambda *args: now)
    checkpoint = tmp_path / "checkpoints" / "checkpoint-250"
    args = SimpleNamespace(device=torch.device("cpu"), bf16=False, fp16=False)
    note_environment(tmp_path, args, SimpleNamespace(resume_from=checkpoint))
    said = capsys.readouterr()
    assert ("threads 2 -> 4" in said.out + said.err) == moved
    assert [e["step"] for e in recorded_environments(tmp_path)] == [0, 250]
    lines = environment_lines(tmp_path)
    assert lines[0] == f"- trained on: {describe(first)}"
    assert "Test CPU, 2 threads of 2 cores" in lines[0] and "OMP_WAIT_POLICY=PASSIVE" in lines[0]
    assert lines[1:] == ([f"- from step 250 (resumed): {describe(now)}"] if moved else [])


@pytest.mark.parametrize("recoded", [False, True])
def test_a_resume_with_other_code_says_so_and_the_card_lists_it(recoded, tmp_path, monkeypatch, capsys):
    from convattn.training.pretrain import job

    first = fake_start(2, {}, code="aaa")
    record_environment(tmp_path, 0, first)
    now = fake_start(2, {}, code="bbb" if recoded else "aaa")
    monkeypatch.setattr(job, "environment", lambda *args: now)
    args = SimpleNamespace(device=torch.device("cpu"), bf16=False, fp16=False)
    note_environment(tmp_path, args, SimpleNamespace(resume_from=tmp_path / "checkpoints" / "checkpoint-250"))
    said = capsys.readouterr()
    assert ("resuming with other code than the start at step 0: convattn code aaa -> bbb" in said.out + said.err
            ) == recoded
    assert "other settings" not in said.out + said.err
    assert environment_lines(tmp_path)[1:] == ([f"- from step 250 (resumed): {describe(now)}"] if recoded else [])


def test_a_line_that_is_not_an_object_is_skipped(tmp_path):
    """Only objects are starts: a stray JSON value would break the card's and the comparison's lines."""
    record_environment(tmp_path, 0, {"threads": 2})
    with open(tmp_path / ENVIRONMENT_FILE, "a", encoding="utf-8") as f:
        f.write("null\n[1, 2]\n")
    assert [e["threads"] for e in recorded_environments(tmp_path)] == [2]


def test_the_description_counts_processes_and_leaves_out_the_load_when_asked():
    """"1 process" and "2 processes"; a comparison's machine line (load=False) names no one start's load."""
    assert "Test CPU, 2 threads of 2 cores), 1 process, fp32," in describe(fake_start(2, {}))
    assert "), 2 processes, fp32," in describe(dict(fake_start(2, {}), processes=2))
    assert "load average" not in describe(fake_start(2, {}), load=False)


def test_a_run_from_before_the_record_has_no_environment_lines(tmp_path):
    assert environment_lines(tmp_path) == []
