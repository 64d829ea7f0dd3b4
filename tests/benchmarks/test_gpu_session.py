"""benchmarks/gpu_session.sh, a GPU session's one call: rehearsed end to end on CPU (tiny shapes, the kernel under
Triton's interpreter, the training step through `convattn pretrain`), a stage's bookkeeping when an arm breaks the
CUDA context or time runs out, the bars' verdicts from a GPU's files, and the training step's corpus from the kit."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SRC = BENCHMARKS.parent / "src/convattn/attention/relative"


@pytest.fixture(scope="module")
def gpu_session():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import gpu_session

        yield gpu_session
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.slow
def test_the_rehearsal_runs_every_stage_in_the_calls_order_and_prints_the_summary_last(tmp_path, benchmark_rows):
    result = subprocess.run(["bash", str(BENCHMARKS / "gpu_session.sh"), "--rehearse"], capture_output=True,
                            text=True, timeout=1200, env={**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert {path.name for path in tmp_path.iterdir()} == {
        "session.log", "gate.json", "kernels.json", "train.json", "tests.json", "host.json", "flex.json", "summary.md",
        "gpu_session.jsonl"}
    said = result.stdout.splitlines()
    stages = [line.split()[2] for line in said if line.startswith("gpu_session: stage ")]
    assert stages == ["gate:", "kernels:", "train:", "tests:", "host:", "flex:"], said
    assert all("exit 0" in line for line in said if line.startswith("gpu_session: stage "))
    # the GPU call's plan first, then what each stage said, in the call's order: the gate, the kernels stage's long
    # lengths plain first, the training step's batch-128 graphs rows first, the tests a GPU runs, named
    plan = [line for line in said if line.startswith("gpu_session: plan: ")]
    assert [line.split()[2] for line in plan[1:]] == ["gate", "kernels", "train", "tests", "host", "flex"]
    assert ("kernels (125 s, 68 rows): 8 x 4 x 2,048 sdpa; 8 x 4 x 2,048 plain dQ split; 8 x 4 x 2,048 plain dQ "
            "atomic; 2 x 12 x 8,192 sdpa;") in plan[2]
    assert "train (220 s, 18 rows): graphs batch 128 composite; graphs batch 128 absolute; eager batch 128" in plan[3]
    first = {stage: next(i for i, line in enumerate(said) if line.startswith(f"gpu_session: {stage}: "))
             for stage in ("gate", "warm-up", "kernels", "train", "tests", "host", "flex")}
    assert first["gate"] < first["kernels"] < first["warm-up"] < first["train"] < first["tests"] < first["host"] < (
        first["flex"])
    assert said[first["gate"]].startswith("gpu_session: gate: plain at 1 x 2 x 40 dQ split: pass")
    assert said[first["kernels"]].startswith("gpu_session: kernels: 1 x 1 x 16 sdpa: ")
    assert said[first["train"]].startswith("gpu_session: train: graphs batch 4 composite: skipped")
    selection = next(line for line in said if line.startswith("gpu_session: tests: the GPU's selection, "))
    assert "the bars' first: test_every_term_combination_matches_the_reference" in selection  # whole in tests.json
    assert "test_the_step_replays_as_cuda_graphs_and_computes_what_eager_does" in selection  # a GPU's alone
    assert "4 units compiled by 1 processes" in said[first["warm-up"]]  # the gate's: both dQ designs

    gate = json.loads((tmp_path / "gate.json").read_text())["rows"]
    assert [(row["gate"], row["design"], row["verdict"]) for row in gate] == [
        (case, design, "pass") for design in ("split", "atomic") for case in ("plain", "composite+key")]
    assert set(gate[1]["tilings"]["tiling 0"]["errors"]) == {"out", "q", "k", "v", "fixed", "query_kernel",
                                                             "key_kernel"}
    packages, tests = json.loads((tmp_path / "tests.json").read_text())["rows"]
    assert packages["versions"]["torch"] and not packages["import_failed"], packages
    assert len(tests["selection"]) >= 10 and tests["selection"][0].endswith("[split-projected-composite-clip]"), tests
    assert tests["rehearsed"] == tests["selection"][:2] and tests["rc"] == 0, tests
    assert tests["passed"] + tests["skipped"] == 2 and tests["failures"] == tests["not_run"] == [], tests
    kernel = (SRC / "triton_attention.py").exists() or (SRC / "triton").is_dir()
    for stage, measured in (("kernels", "wall_ms"), ("host", "host_ms"), ("flex", "wall_ms")):
        rows = json.loads((tmp_path / f"{stage}.json").read_text())["rows"]
        timed = [row for row in rows if kernel or row["arm"] in ("sdpa", "sdpa+dropout", "sdpa+padding", "flex")]
        assert all(row.get(measured, 0) > 0 and "unverified" not in row for row in timed), [
            row for row in timed if "error" in row]
    assert [row["arm"] for row in json.loads((tmp_path / "flex.json").read_text())["rows"]] == [
        "sdpa", "flex", "plain"]
    train = json.loads((tmp_path / "train.json").read_text())["rows"]
    assert [(row["batch"], row["mode"], row["arm"]) for row in train] == [
        (4, mode, arm) for arms in (("composite", "absolute"), ("bert",)) for mode in ("graphs", "eager", "compiled")
        for arm in arms]
    for row in train:
        if row["mode"] == "eager":  # through `convattn pretrain` (and transformers' Trainer for BERT), timed
            assert row.get("tokens_per_s", 0) > 0 and row["steps"] > 0, row
        else:
            assert row["error"].startswith("skipped: the rehearsal does not compile"), row
    summary = (tmp_path / "summary.md").read_text()
    assert result.stdout.rstrip().endswith(summary.split("\n## Every arm's kernels")[0].rstrip())
    for section in ("## Gate", "Passed: the kernel and training rows are verified.", "## Tests",
                    "## Bars on CPU (rehearsal", "## Device time per call", "## Host time per call",
                    "## Training step", "## FlexAttention"):
        assert section in summary
    assert "| training step: composite's tokens/s vs absolute's | batch 4, eager |" in summary
    # the session's row: the bars, then every stage's rows; a rehearsal's beside its files, not in the results
    assert not (benchmark_rows / "gpu_session.jsonl").exists()
    row = json.loads((tmp_path / "gpu_session.jsonl").read_text())
    assert row["command"] == "bash benchmarks/gpu_session.sh --rehearse" and row["gate"] == "passed", row
    assert any(figure["stage"] == "bars" and figure["where"] == "batch 4, eager" for figure in row["figures"])
    assert {figure["stage"] for figure in row["figures"]} >= {"bars", "gate", "kernels", "train", "host", "flex"}


def test_a_stage_goes_on_past_a_broken_context_without_that_arm_and_records_what_time_left_out(gpu_session,
                                                                                               tmp_path, monkeypatch):
    rows = [dict(n=n, arm=arm) for n in (1, 2) for arm in ("plain", "sdpa")]

    def measure(row, plan, deadline):
        if row["arm"] == "plain":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return {"device_ms": 1.0}
    monkeypatch.setitem(gpu_session.STAGES, "kernels", (lambda plan: rows, measure))
    monkeypatch.setattr(gpu_session, "context_lost", lambda plan: True)
    plan, file = gpu_session.REHEARSAL, tmp_path / "kernels.json"

    assert gpu_session.run_stage("kernels", plan, tmp_path, time.time() + 60) == gpu_session.RESTART
    assert gpu_session.run_stage("kernels", plan, tmp_path, time.time() + 60) == 0  # the session's restart
    recorded = json.loads(file.read_text())["rows"]
    assert [row.get("device_ms") or row["error"].split(":")[0] for row in recorded] == [
        "failed", 1.0, "skipped", 1.0]
    assert recorded[0]["context_lost"] and "illegal memory access" in recorded[0]["error"]

    file.unlink()
    assert gpu_session.run_stage("kernels", plan, tmp_path, time.time() - 1) == 0
    assert {row["error"] for row in json.loads(file.read_text())["rows"]} == {
        "not measured: the stage ran out of time"}


def test_a_stage_started_again_after_its_process_died_goes_on_past_the_row_it_died_in(gpu_session, tmp_path,
                                                                                     monkeypatch):
    rows = [dict(n=n, arm="plain") for n in (1, 2, 3)]
    monkeypatch.setitem(gpu_session.STAGES, "kernels",
                        (lambda plan: rows, lambda row, plan, deadline: {"device_ms": 1.0}))
    plan = gpu_session.dataclasses.replace(gpu_session.REHEARSAL, work=str(tmp_path))
    # what a process that died (a segmentation fault, say) measuring n = 2 left: its file, and the row it was in
    (tmp_path / "kernels.json").write_text(json.dumps({"machine": "", "autotuned": [], "rows": [
        {**rows[0], "device_ms": 1.0}]}))
    (tmp_path / "kernels.current").write_text(json.dumps(rows[1]))

    assert gpu_session.run_stage("kernels", plan, tmp_path, time.time() + 60) == 0
    recorded = json.loads((tmp_path / "kernels.json").read_text())["rows"]
    assert [row.get("device_ms") or row["error"] for row in recorded] == [
        1.0, "failed: the stage's process died measuring it (its exit status: session.log)", 1.0]
    assert not (tmp_path / "kernels.current").exists()
    # the session starts a stage, again after a lost CUDA context, and at most RESTARTS times after a death
    assert gpu_session.again(gpu_session.RESTART, 0) and gpu_session.again(-11, gpu_session.RESTARTS - 1)
    assert not gpu_session.again(-11, gpu_session.RESTARTS) and not gpu_session.again(0, 0)
    assert not gpu_session.again("stopped at its time limit (-9)", 0)


def test_the_kernels_tilings_are_unknown_where_its_module_no_longer_says(gpu_session, monkeypatch):
    def missing(name):
        raise ImportError(f"No module named {name!r}")
    monkeypatch.setattr(gpu_session.importlib, "import_module", missing)
    assert gpu_session.autotuned() == ["unknown (the kernel's module has no autotuned_configs)"]


def test_the_summary_gives_each_bar_its_verdict_on_the_named_device(gpu_session, tmp_path):
    plan = gpu_session.dataclasses.replace(gpu_session.GPU, designs=("split",))  # one design: bars without "dQ ..."
    gpu = "NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, triton 3.6.0, bfloat16"
    # device ms per call: the kernel's arms at these multiples of their baselines
    times = {"sdpa": 1.0, "sdpa+dropout": 2.0, "sdpa+padding": 4.0, "plain": 1.1, "+dropout": 2.8, "+padding": 4.4,
             "+row table": 5.2, "+key table": 6.0, "composite+key": 6.8}
    kernels = [dict(batch=b, heads=h, n=n, arm=arm, device_ms=ms * n / 512, launches=3,
                    kernels=[{"name": f"{arm}_kernel", "ms": ms, "calls": 1}],
                    **({} if arm.startswith("sdpa") else {"design": "split"}))
               for b, h, n in plan.shapes for arm, ms in times.items()]
    train = [dict(mode=mode, batch=batch, arm=arm, tokens_per_s=speed, peak_mib=memory, ms_per_step=10.0, busy=0.5,
                  first_step_s=1.0, steps=20)
             for mode in ("eager", "compiled", "graphs") for batch in (128, 512)
             for arm, speed, memory in (("composite", 85.0 if mode == "eager" else 80.0, 1050.0),
                                        ("absolute", 100.0, 1000.0), ("bert", 110.0, 1200.0))]
    for stage, rows in (("kernels", kernels), ("train", train)):
        (tmp_path / f"{stage}.json").write_text(json.dumps({"machine": gpu, "autotuned": [], "rows": rows}))

    text, short = gpu_session.summary(tmp_path, plan)
    assert short.startswith(f"# GPU session: {gpu}") and "## Bars on NVIDIA H100 80GB HBM3\n" in short
    assert "| plain kernel vs SDPA flash | 8 x 4 x 2,048 | 1.10x | <= 1.15x | pass |" in short
    assert "| plain kernel vs SDPA flash | 32 x 4 x 512 |" not in short  # from n = 2,048 only
    assert "| kernel + dropout 0.1 vs SDPA flash + dropout | 32 x 4 x 512 | 1.40x | <= 1.3x | fail |" in short
    assert "| composite vs SDPA with the same mask and dropout | 2 x 12 x 8,192 | 1.30x | <= 1.35x | pass |" in short
    assert "| composite+key vs SDPA with the same mask and dropout | 128 x 4 x 512 | 1.70x | <= 1.6x | fail |" in short
    assert "| training step: composite's tokens/s vs absolute's | batch 512, eager | 0.85x | >= 0.8x | pass |" in short
    assert ("| training step: composite's tokens/s vs absolute's | batch 128, compiled | 0.80x | >= 0.9x | fail |"
            in short)
    assert ("| training step: composite's peak memory vs absolute's | batch 128, eager | 1.05x | <= 1.1x | pass |"
            in short)
    assert ("| training step: composite's tokens/s vs absolute's | batch 512, graphs | 0.80x | >= 0.9x | fail |"
            in short)
    # 2 plain + 4 dropout + 4 composite + 4 composite+key; 6 tokens/s + 6 memory
    assert "Bars passed: 14 of 26 (12 failed, 0 not measured)." in short
    assert "- sdpa+padding (8 x 4 x 2,048; 2 x 12 x 8,192; 32 x 4 x 512; 128 x 4 x 512): `sdpa+padding_kernel`" in short
    assert "Unverified: the gate did not run" in short  # no gate.json: its rows say nothing, the summary says so
    assert "## Failed, skipped or not measured" in short and "host: not measured: the stage did not run" in short
    assert "`composite+key_kernel` 6.8000 ms x 1" in text


def test_the_training_steps_corpus_is_the_kits_wikipedia_text_and_its_tokenizer(gpu_session, tmp_path):
    import pretrain_step

    kit, work = tmp_path / "kit", tmp_path / "work"
    (kit / "tokenizer").mkdir(parents=True)
    work.mkdir()
    with tarfile.open(kit / "corpus.tar.xz", "w:xz") as tar:
        for name, text in (("corpus/enwiki-2015-sample/a.txt", "first line\nsecond line\ncut here"),
                           ("corpus/gutenberg-books/b.txt", "a book\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    data = pretrain_step.corpus(work, rehearse=False, kit=kit)
    assert data.tokenizer == kit / "tokenizer"
    assert {path.name: path.read_text() for path in data.train.iterdir()} == {"a.txt": "first line\nsecond line\n"}
    with pytest.raises(pretrain_step.NotMeasured, match="no kit at"):
        pretrain_step.corpus(work, rehearse=False, kit=tmp_path / "none")


def test_the_training_corpus_ends_at_a_whole_line_and_holds_no_empty_file(gpu_session, tmp_path, monkeypatch):
    """Where the corpus's byte budget runs out inside a file's first line, that file is left out rather than
    written empty (`convattn pretrain` refuses an empty file: the training stage of the 2026-11-30 call failed so)."""
    import pretrain_step

    kit = tmp_path / "kit"
    (kit / "tokenizer").mkdir(parents=True)
    files = (("corpus/enwiki-2015-sample/a.txt", "one line\ntwo\n"), ("corpus/enwiki-2015-sample/b.txt",
                                                                       "a first line longer than what is left\n"),
             ("corpus/enwiki-2015-sample/c.txt", "c\n"))
    with tarfile.open(kit / "corpus.tar.xz", "w:xz") as tar:
        for name, text in files:
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    monkeypatch.setattr(pretrain_step, "CORPUS_BYTES", len("one line\ntwo\n") + 10)
    (tmp_path / "work").mkdir()
    data = pretrain_step.corpus(tmp_path / "work", rehearse=False, kit=kit)
    assert {path.name: path.read_text() for path in data.train.iterdir()} == {"a.txt": "one line\ntwo\n"}


def test_each_training_mode_reaches_convattn_pretrain_and_berts_trainer_as_its_compile_mode(gpu_session, tmp_path):
    import pretrain_step

    from convattn.cli import build_parser
    from convattn.commands.arguments import compile_mode_asked
    from convattn.training.execution import compile_arguments

    data = pretrain_step.Corpus(train=tmp_path / "train", tokenizer=tmp_path / "tokenizer")
    expected = {"eager": None, "compiled": "default", "graphs": "reduce-overhead"}
    for mode, compile_mode in expected.items():
        row = dict(mode=mode, batch=128, arm="composite")
        argv = pretrain_step.convattn_argv(row, pretrain_step.GPU_TRAIN, data, tmp_path, tmp_path / "out")
        assert compile_mode_asked(build_parser().parse_args(argv)) == compile_mode, mode
        assert compile_arguments(pretrain_step.MODES[mode]) == {
            "torch_compile": mode != "eager", "torch_compile_mode": "reduce-overhead" if mode == "graphs" else None}


# --- the call's order (issue 62), read from the plan's functions: no stage runs --------------------------------------

def test_the_call_runs_the_gate_first_and_its_budgets_fit_the_device_call(gpu_session):
    plan = gpu_session.GPU
    assert list(plan.budgets) == list(gpu_session.STAGES) == ["gate", "kernels", "train", "tests", "host", "flex"]
    assert plan.budgets["gate"] <= 45
    # the device call's command may run 600 s; the machine's start and the files' return need the rest of 15 minutes
    assert sum(plan.budgets.values()) + gpu_session.SLACK <= 510
    assert list(gpu_session.REHEARSAL.budgets) == list(plan.budgets)
    lines = gpu_session.plan_lines(plan)
    assert [line.split()[0] for line in lines[1:]] == list(plan.budgets)
    assert lines[1] == ("gate (45 s, 4 rows): plain at 4 x 8 x 512 dQ split; composite+key at 4 x 8 x 512 dQ split; "
                        "plain at 4 x 8 x 512 dQ atomic; composite+key at 4 x 8 x 512 dQ atomic")


def test_the_kernels_stage_measures_the_long_lengths_first_plain_first_each_dq_design_side_by_side(gpu_session,
                                                                                               monkeypatch):
    monkeypatch.setitem(gpu_session.DESIGNS, "atomic", gpu_session.Design(None, False))
    plan = gpu_session.dataclasses.replace(gpu_session.GPU, designs=("split", "atomic"))
    rows = gpu_session.kernel_rows(plan)
    named = [(row["n"], row["arm"], row.get("design")) for row in rows]
    assert named[:6] == [(2048, "sdpa", None), (2048, "plain", "split"), (2048, "plain", "atomic"),
                         (8192, "sdpa", None), (8192, "plain", "split"), (8192, "plain", "atomic")]
    lengths = [n for n, _, _ in named]
    assert lengths.index(512) == sum(n >= 2048 for n in lengths)  # every long row before the first n = 512
    long = [arm for n, arm, _ in named if n >= 2048]
    terms = ("+row table", "composite+key", "+padding", "+key table")
    assert max(long.index(arm) for arm in ("plain", "+dropout")) < min(long.index(arm) for arm in terms)
    assert named[lengths.index(512):][:2] == [(512, "sdpa", None), (512, "plain", "split")]
    kernel_arms = [arm for arm, spec in gpu_session.ARMS.items() if spec.kind == "kernel"]
    given = [arm for arm in kernel_arms if gpu_session.ARMS[arm].given_tables]
    assert given == ["+row table, given", "composite+key, given"]
    # every kernel arm at every shape in every design (the tables given in the first alone), the SDPA arms once
    for design in plan.designs:
        arms = len(kernel_arms) - (len(given) if design != plan.designs[0] else 0)
        assert sum(d == design for _, _, d in named) == arms * len(plan.shapes)
    # at each length, the given tables' rows after every other: a comparison, not a bar
    for at_length in ([arm for n, arm, _ in named if n >= 2048], [arm for n, arm, _ in named if n < 2048]):
        assert min(at_length.index(arm) for arm in given) > max(
            i for i, arm in enumerate(at_length) if arm not in given)
    assert sum(d is None for _, _, d in named) == 3 * len(plan.shapes)
    assert len({gpu_session.key(row) for row in rows}) == len(rows)


def test_the_training_stage_runs_batch_128_as_cuda_graphs_first_and_bert_after_the_bars_pair(gpu_session):
    rows = [(row["batch"], row["mode"], row["arm"]) for row in gpu_session.train_rows(gpu_session.GPU)]
    assert rows[:6] == [(128, "graphs", "composite"), (128, "graphs", "absolute"), (128, "eager", "composite"),
                        (128, "eager", "absolute"), (128, "compiled", "composite"), (128, "compiled", "absolute")]
    assert rows[6:9] == [(128, mode, "bert") for mode in ("graphs", "eager", "compiled")]
    assert [batch for batch, _, _ in rows] == [128] * 9 + [512] * 9
    assert rows[9:] == [(512, mode, arm) for batch, mode, arm in rows[:9]]


def test_the_warm_up_compiles_every_tiling_of_every_timed_kernel_row_the_gates_first(gpu_session, monkeypatch):
    plan = gpu_session.GPU
    units = gpu_session.warm_units(plan, 4)
    assert [(row.get("gate"), index) for row, index in units[:8]] == [
        (case, index) for case in ("plain", "composite+key") for index in range(4)]
    warmed = {gpu_session.key(row) for row, _ in units}
    kernel_rows = [row for stage in ("kernels", "host", "flex") for row in gpu_session.STAGES[stage][0](plan)
                   if gpu_session.ARMS[row["arm"]].kind == "kernel"]
    # a row timed through torch.library's operators (host stage) launches the same kernels as its eager row
    assert kernel_rows and all(gpu_session.key(row | {"path": None}) in warmed for row in kernel_rows)
    assert any(row.get("path") == "operators" for row in kernel_rows)
    assert all(gpu_session.key(gpu_session.shape_row(shape, "+row table", "split")) in warmed
               for shape in ((2, 4, 128), (2, 4, 120)))  # the training step's attention, eager
    assert len(warmed) * 4 == len(units)
    # the processes (each a warm() of its own) take the units in turn: the first ones side by side, each unit once
    taken, firsts = [], []

    def warm_unit(row, index, plan):
        taken.append((gpu_session.key(row), index))
        return []
    monkeypatch.setattr(gpu_session, "tiling_count", lambda plan: 4)
    monkeypatch.setattr(gpu_session, "warm_unit", warm_unit)
    for worker in range(plan.warm_workers):
        before = len(taken)
        assert gpu_session.warm(plan, worker, plan.warm_workers) == 0
        firsts.append(taken[before])
    every = [(gpu_session.key(row), index) for row, index in units]
    assert firsts == every[:plan.warm_workers] and Counter(taken) == Counter(every)


# --- the gate ---------------------------------------------------------------------------------------------------------

def test_the_gate_fails_a_kernel_whose_numbers_are_off_or_differ_between_two_backward_passes(gpu_session,
                                                                                           monkeypatch):
    import gpu_gate
    import torch

    calls = []

    def kernel(qkv, rel, keep, dtype, weights, scale=1.0):
        calls.append(scale)
        return [x * scale for x in gpu_gate.expected(qkv, rel, keep, weights)]

    monkeypatch.setattr(gpu_gate, "kernel_call", kernel)
    right = gpu_gate.check("plain", (1, 2, 24), 8, "float32", "cpu", tilings=2)
    assert right["verdict"] == "pass" and list(right["tilings"]) == ["tiling 0", "tiling 1"]
    assert right["tilings"]["tiling 0"]["same_bits"] and set(right["sdpa_errors"]) == {"out", "q", "k", "v"}

    monkeypatch.setattr(gpu_gate, "kernel_call", lambda *args: kernel(*args, scale=1.01))
    wrong = gpu_gate.check("composite+key", (1, 2, 24), 8, "float32", "cpu")
    assert wrong["verdict"] == "fail" and wrong["failed"].startswith("tiling 0: out 1.00e-02 > 0.0001")
    assert "key_kernel" in wrong["tilings"]["tiling 0"]["errors"]

    scales = iter([1.0, 1.0 + 2**-20])  # the second pass a rounding apart: within tolerance, not the same bits
    monkeypatch.setattr(gpu_gate, "kernel_call", lambda *args: kernel(*args, scale=next(scales)))
    racy = gpu_gate.check("plain", (1, 2, 24), 8, "float32", "cpu")
    assert racy["verdict"] == "fail" and racy["failed"] == "tiling 0: two backward passes differ"
    assert torch.isfinite(torch.tensor(list(racy["tilings"]["tiling 0"]["errors"].values()))).all()

    late = gpu_gate.check("plain", (1, 2, 24), 8, "float32", "cpu", tilings=3, deadline=0)
    assert late["verdict"] == "not finished" and late["tilings"] == {}


def test_the_gate_fails_a_kernel_that_leaves_an_element_unwritten(gpu_session, monkeypatch):
    """Its buffers start as NaN in the gate (on a GPU a later tiling's would hold the right values an earlier one
    wrote): a kernel writing every output row but one fails, and a floating buffer the launch code allocates starts
    as NaN while an integer one is left as it is."""
    import gpu_gate
    import torch

    def kernel(qkv, rel, keep, dtype, weights):
        results = gpu_gate.expected(qkv, rel, keep, weights)
        out = torch.empty_like(results[0])
        out[:, :, :-1] = results[0][:, :, :-1]  # the last query row never written
        return [out, *results[1:]]

    monkeypatch.setattr(gpu_gate, "kernel_call", kernel)
    allocators = (torch.empty, torch.empty_like, torch.Tensor.new_empty)
    holey = gpu_gate.check("plain", (1, 2, 24), 8, "float32", "cpu", tilings=2)
    assert holey["verdict"] == "fail" and holey["failed"].startswith("tiling 0: out inf > 0.0001")
    with gpu_gate.poisoned_allocations():
        floats = [torch.empty(3), torch.empty_like(torch.ones(2)), torch.ones(1).new_empty(4, dtype=torch.bfloat16)]
        assert all(x.isnan().all() for x in floats)
        assert torch.empty(3, dtype=torch.int64).dtype == torch.int64
    assert (torch.empty, torch.empty_like, torch.Tensor.new_empty) == allocators  # put back


@pytest.mark.slow
@pytest.mark.parametrize("design", ["split", "atomic"])
def test_the_gate_passes_the_kernel_at_each_tiling_a_gpu_tries(gpu_session, monkeypatch, design):
    """The tilings the GPU's autotuners try (half precision, 64 channels), not the interpreter's one, pinned in turn
    as the call's gate pins them, with every buffer poisoned: both cases, odd lengths, in float32 under the
    interpreter (6-16 s a design)."""
    import gpu_gate
    import torch

    from convattn.attention.relative.triton import launch

    with monkeypatch.context() as patch:
        patch.setattr(launch, "interpreting", lambda: False)
        gpu_tilings = {kernel: launch.configs(kernel, 64, torch.bfloat16) for kernel in ("forward", "backward")}
    assert len(gpu_tilings["backward"]) > 1 and gpu_tilings["forward"] != launch.configs("forward", 64, torch.float32)
    monkeypatch.setattr(launch, "configs", lambda kernel, head_dim, dtype: gpu_tilings[kernel])
    chosen = gpu_session.DESIGNS[design]
    count = max(len(tilings) for tilings in gpu_tilings.values())
    for case, shape in (("plain", (1, 2, 131)), ("composite+key", (2, 1, 131))):  # odd, past a 128-row tile
        row = gpu_gate.check(case, shape, 64, "float32", "cpu", chosen.select, chosen.deterministic, count)
        assert row["verdict"] == "pass" and len(row["tilings"]) == count, (case, row)


def test_a_gate_that_did_not_pass_marks_the_kernel_and_training_rows_unverified(gpu_session, tmp_path, monkeypatch):
    plan = gpu_session.REHEARSAL
    gate = gpu_session.gate_rows(plan)
    assert gpu_session.gate_verdict(tmp_path, plan) == "unverified: the gate did not run"
    (tmp_path / "gate.json").write_text(json.dumps({"machine": "", "autotuned": [], "rows": [
        {**gate[0], "verdict": "pass", "tilings": {}},
        {**gate[1], "verdict": "fail", "failed": "tiling 2: q 3.10e-01 > 0.02", "tilings": {}}]}))
    reason = gpu_session.gate_verdict(tmp_path, plan)
    assert reason == "unverified: the gate failed (composite+key, dQ split: tiling 2: q 3.10e-01 > 0.02)"

    kernel_rows = [gpu_session.shape_row((1, 1, 16), arm, design)
                   for arm, design in (("sdpa", None), ("plain", "split"))]
    train_rows = [dict(mode="eager", batch=4, arm=arm) for arm in ("composite", "absolute")]
    monkeypatch.setitem(gpu_session.STAGES, "kernels", (lambda plan: kernel_rows,
                                                        lambda row, plan, deadline: {"wall_ms": 1.0}))
    monkeypatch.setitem(gpu_session.STAGES, "train", (lambda plan: train_rows,
                                                      lambda row, plan, deadline: {"tokens_per_s": 10.0}))
    for stage in ("kernels", "train"):
        assert gpu_session.run_stage(stage, plan, tmp_path, time.time() + 60) == 0
    kernels = json.loads((tmp_path / "kernels.json").read_text())["rows"]
    assert [row.get("unverified") for row in kernels] == [None, reason]  # SDPA needs no gate; both still measured
    assert all(row["wall_ms"] == 1.0 for row in kernels)
    assert [row["unverified"] for row in json.loads((tmp_path / "train.json").read_text())["rows"]] == [reason] * 2
    _, short = gpu_session.summary(tmp_path, plan)
    assert "Unverified: the gate failed (composite+key" in short
    assert "| training step: composite's tokens/s vs absolute's | batch 4, eager | 1.00x | >= 0.8x | pass " \
           "(unverified) |" in short
    assert "| 1 x 1 x 16 | plain | split | sdpa | 1.000 | 1.00x | - | - | unverified |" in short


# --- the training step's graphs, the tests' selection ---------------------------------------------------------------

def test_a_compiled_run_records_its_graph_breaks_and_cudagraph_skips_and_a_graphs_row_with_any_is_not_graphed(
        gpu_session):
    import pretrain_step
    import torch
    from torch._inductor import cudagraph_utils

    def step(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    torch._dynamo.reset()
    with pretrain_step.compile_events() as events:
        cudagraph_utils.log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs")
        torch.compile(step, backend="eager")(torch.ones(3))
    torch._dynamo.reset()
    assert events["graph_breaks"] == 1 and "graph_break()" in events["graph_break_reasons"][0]
    assert events["cudagraph_skips"] == 1
    assert events["cudagraph_skip_reasons"] == ["skipping cudagraphs due to mutated inputs"]
    assert pretrain_step.not_graphed(events).startswith(
        "not graphed: 1 cudagraph skips (skipping cudagraphs due to mutated inputs); 1 graph breaks (")
    assert cudagraph_utils.cudagraphs_log.__class__.__name__ != "_SkipReasons"  # the log is given back
    with pretrain_step.compile_events() as quiet:
        pass
    assert pretrain_step.not_graphed(quiet) is None


def test_the_gpus_selection_is_read_from_the_tests_marks_the_bars_first(gpu_session):
    import cuda_selection

    class Mark:
        def __init__(self, name, *args, **kwargs):
            self.name, self.args, self.kwargs = name, args, kwargs

    class Item:
        def __init__(self, nodeid, *marks):
            self.nodeid, self.marks = nodeid, marks

        def iter_markers(self):
            return iter(self.marks)

    file = "tests/attention/relative/test_triton_attention.py::"
    items = [Item(f"{file}test_layers_take_the_kernel_by_name_and_match_eager"),
             Item(f"{file}test_short_sequences_and_other_head_sizes[1-8-64]", Mark("skipif", True, reason="GPU")),
             Item(f"{file}test_half_precision_against_float32[dtype0]", Mark("skipif", False, reason="CPU")),
             Item("tests/attention/relative/test_triton_cuda_graphs.py::test_each_replay"),
             Item(f"{file}test_every_term_combination_matches_the_reference_with_padding[composite-clip]"),
             Item(f"{file}test_string_condition", Mark("skipif", "sys.platform == 'win32'")),
             Item(f"{file}test_skipped", Mark("skip"))]
    kept = [item for item in items if not cuda_selection.skipped(item)]
    kept.sort(key=lambda item: cuda_selection.rank(item.nodeid))
    assert [item.nodeid.split("::")[1] for item in kept] == [
        "test_every_term_combination_matches_the_reference_with_padding[composite-clip]",
        "test_half_precision_against_float32[dtype0]", "test_each_replay",
        "test_layers_take_the_kernel_by_name_and_match_eager", "test_string_condition"]


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_the_tests_stage_records_every_tests_outcome_and_each_failures_message(gpu_session, tmp_path, workers):
    """No -x: a failure does not stop the run (the 2026-11-30 call ran 23 of its 38 tests and kept no message); each
    outcome is a line of the outcomes file as the test ends, once under pytest-xdist too, a failure with its
    exception's message; the summary names each failure and what did not run."""
    (tmp_path / "test_probe.py").write_text(
        "import pytest\n"
        "def test_passes():\n    pass\n"
        "def test_fails():\n    raise RuntimeError('runs on a CUDA GPU, and this model is on cpu')\n"
        "@pytest.fixture\ndef broken():\n    raise KeyError('set-up')\n"
        "def test_set_up_fails(broken):\n    pass\n"
        "def test_skips():\n    pytest.skip('not here')\n"
        "def test_compares():\n    assert [1, 2] == [1, 3]\n")
    outcomes = tmp_path / "outcomes"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "cuda_selection",
                    "--outcomes-file", str(outcomes), *workers, "test_probe.py"], cwd=tmp_path, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(BENCHMARKS)}, check=False)
    selection = [f"test_probe.py::test_{name}" for name in ("passes", "fails", "set_up_fails", "skips", "compares",
                                                               "never_reached")]
    said = gpu_session.read_outcomes(outcomes, selection)
    assert (said["passed"], said["skipped"], said["not_run"]) == (1, 1, ["test_probe.py::test_never_reached"])
    failures = {failure["test"].split("::")[1]: failure for failure in said["failures"]}
    assert sorted(failures) == ["test_compares", "test_fails", "test_set_up_fails"]
    assert failures["test_fails"]["message"] == "RuntimeError: runs on a CUDA GPU, and this model is on cpu"
    assert failures["test_set_up_fails"]["when"] == "setup" and "KeyError: 'set-up'" in failures[
        "test_set_up_fails"]["message"]
    assert failures["test_compares"]["message"].startswith("assert [1, 2] == [1, 3]")
    row = {"tests": "kernel", "files": ["test_probe.py"], "selection": selection, "rc": 1, "result": "3 failed",
           **said}
    lines = gpu_session.tests_lines([row])
    assert ("  - failed: `test_probe.py::test_fails`: RuntimeError: runs on a CUDA GPU, and this model is on cpu"
            in lines)
    assert "  - failed: `test_probe.py::test_set_up_fails` (its setup): KeyError: 'set-up'" in lines
    assert "  - not run (1): `test_never_reached`" in lines
    assert not any("test_passes" in line for line in lines)  # the selection is in tests.json, not the summary


def test_a_tiling_is_pinned_for_the_gate_and_the_warm_up_and_a_launch_only_compiles_inside_compile_only(
        gpu_session, monkeypatch):
    import kernel_tilings
    import torch

    from convattn.attention.relative.triton import launch

    tilings = [(64, 64, 4, 1), (128, 64, 8, 1), (32, 64, 4, 1)]
    monkeypatch.setattr(launch, "configs", lambda kernel, head_dim, dtype: tilings[:2] if kernel == "forward"
                        else tilings)
    assert kernel_tilings.tiling_count(64, torch.bfloat16) == 3
    with kernel_tilings.pinned_tiling(2):
        assert launch.configs("forward", 64, torch.bfloat16) == [tilings[1]]  # its last, where it has fewer
        assert launch.configs("backward", 64, torch.bfloat16) == [tilings[2]]
    assert launch.configs("backward", 64, torch.bfloat16) == tilings

    warmed = []

    class Kernel:
        __name__ = "backward_kernel"

        def warmup(self, *args, grid, **kwargs):
            warmed.append((args, grid, kwargs))

    original = launch.wrapped
    with kernel_tilings.compile_only() as compiled:
        launch.wrapped(Kernel())[(4, 2)](1, 2, BLOCK_M=64)
    assert launch.wrapped is original
    assert warmed == [((1, 2), (4, 2), {"BLOCK_M": 64})] and compiled[0][0] == "backward_kernel"

    monkeypatch.delattr(launch, "AUTOTUNERS")  # a rework that renames what a tiling is pinned through
    with pytest.raises(kernel_tilings.TilingsUnknown, match="AUTOTUNERS"):
        kernel_tilings.tiling_count(64, torch.bfloat16)


def test_every_test_the_bars_put_first_exists(gpu_session):
    """A renamed kernel test would silently lose its place at the head of the GPU's selection."""
    import cuda_selection

    tests = Path(__file__).parents[1] / "attention" / "relative"
    defined = "".join(path.read_text() for path in tests.glob("test_triton*.py"))
    for name in cuda_selection.BARS_FIRST:
        assert (tests / name).is_file() if name.endswith(".py") else f"def {name}(" in defined, name


def test_the_host_stages_operator_rows_go_through_torch_library_and_the_others_do_not(gpu_session, monkeypatch):
    """The host stage times composite's and composite+key's eager call beside the same call through torch.library's
    operators (the eager path before 2026-12-01), from one process."""
    import torch

    from convattn.attention.relative.triton import operator

    calls = []
    forward = operator.attention_forward
    monkeypatch.setattr(operator, "attention_forward", lambda *args: calls.append(args[0].shape) or forward(*args))
    rows = [row for row in gpu_session.host_rows(gpu_session.REHEARSAL) if row["arm"] == "+row table"]
    assert [row.get("path") for row in rows] == [None, "operators"]
    for row in rows:
        step, _ = gpu_session.attention_step(row, gpu_session.REHEARSAL)
        step()
        assert len(calls) == (row.get("path") == "operators")
    assert operator._eager(torch.ones(1))  # restored
