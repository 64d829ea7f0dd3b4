"""benchmarks/real_scale.py run's plan: both models the same training budget, the whole call (unpacking and
tokenizing included) inside its limit, a continuing call keeping the first call's budget; and the glue stage's table
of the models beside Chang et al.'s rows."""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import subprocess
import time
import types
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "real_scale.py"


@pytest.fixture(scope="module")
def real_scale():
    spec = importlib.util.spec_from_file_location("real_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_plan_fits_the_call_with_equal_budgets(real_scale, capsys):
    args = argparse.Namespace(dry_run=True, limit=real_scale.CALL_LIMIT, presets=real_scale.PRESETS, budget=None)
    assert real_scale.run(args) == 0
    printed = capsys.readouterr().out.splitlines()
    training = [line for line in printed if ": training, " in line]
    assert len(training) == 2 and len({line.split(": training, ")[1] for line in training}) == 1
    total = next(line for line in printed if "total" in line)
    assert float(total.split()[-2]) <= 540 and real_scale.CALL_LIMIT <= 540
    assert "prepare" in "\n".join(printed) and "unpack" in "\n".join(printed)


def test_a_third_model_is_refused_before_anything_runs(real_scale):
    """Three models would come back as 9 files, one more than a device call returns: refused in one line."""
    presets = ",".join(f"chang2021-small/{row}" for row in ("absolute", "composite", "rotary"))
    args = argparse.Namespace(dry_run=True, limit=real_scale.CALL_LIMIT, presets=presets, budget=None)
    with pytest.raises(SystemExit, match="names 3 models; a call brings back at most 2"):
        real_scale.run(args)


def test_a_given_budget_is_the_plans_and_one_that_does_not_fit_says_so(real_scale, capsys):
    """A third model at the budget of an earlier call (rotary at 2026-11-30's 165 s): the plan shows that budget,
    not the one the limit leaves, and says when it overruns the call."""
    args = argparse.Namespace(dry_run=True, limit=real_scale.CALL_LIMIT, presets="chang2021-small/rotary",
                              budget="165s")
    assert real_scale.run(args) == 0
    printed = capsys.readouterr().out
    assert "model 1: training, 165 s budget" in printed and "does not fit" not in printed
    total = next(line for line in printed.splitlines() if "total" in line)
    planned = (sum(real_scale.ESTIMATES.values()) + 165 * real_scale.WALL_PER_BUDGET + real_scale.MODEL_OVERHEAD
               + real_scale.INTERRUPT_GRACE + real_scale.BRING_BACK)
    assert float(total.split()[-2]) == pytest.approx(planned, abs=1)
    args.presets = "chang2021-small/composite,chang2021-small/rotary"
    assert real_scale.run(args) == 0
    assert "--budget 165s does not fit" in capsys.readouterr().out


def test_the_budget_shrinks_with_the_measured_tokenizing_time_and_the_total_stays_inside(real_scale):
    quick, _ = real_scale.plan_lines(540, {"unpack": 10, "prepare": 30}, 2)
    slow, lines = real_scale.plan_lines(540, {"unpack": 10, "prepare": 150}, 2)
    # 120 s more tokenizing: 60 s less of the call for each model, less budget by the wall's share of it
    assert quick - slow == pytest.approx(60 / real_scale.WALL_PER_BUDGET)
    assert "model 1: training, 81 s budget" in lines[2]
    assert float(lines[2].split()[-2]) == pytest.approx(81 * real_scale.WALL_PER_BUDGET, abs=1)
    assert float(lines[-1].split()[-2]) == pytest.approx(540, abs=1)


def test_a_continuing_call_keeps_the_first_calls_budget(real_scale, tmp_path, capsys):
    args = argparse.Namespace(budget=None, limit=540)
    first = real_scale.budget_for_call(args, tmp_path, {"unpack": 10, "prepare": 60}, 2)
    assert first == "107s" and json.loads((tmp_path / real_scale.PLAN_FILE).read_text())["budget"] == "107s"
    assert real_scale.budget_for_call(args, tmp_path, {"unpack": 1, "prepare": 1}, 2) == "107s"
    assert "continuing the first call's plan" in capsys.readouterr().out


def test_a_call_left_without_time_to_train_refuses(real_scale, tmp_path):
    with pytest.raises(SystemExit, match="s of training each is left"):
        real_scale.budget_for_call(argparse.Namespace(budget=None, limit=540), tmp_path, {"prepare": 400}, 2)
    assert not (tmp_path / real_scale.PLAN_FILE).exists()


def test_the_call_counts_its_time_from_gpu_sh_and_stops_training_inside_its_limit(real_scale, tmp_path, monkeypatch):
    """On a clock the test moves: gpu.sh began 30 s before the script (its wheel install, stamped in CALL_STARTED),
    unpacking took 15 s and tokenizing 60 s. Each model gets what the rest of the 540 s leaves, and the comparison
    is interrupted early enough for its interrupt's grace and the models' return to end inside the limit."""
    now = [1030.0]
    clock = types.SimpleNamespace(time=lambda: now[0], monotonic=lambda: now[0])
    monkeypatch.setattr(real_scale, "time", clock)
    monkeypatch.setenv("CALL_STARTED", "1000")

    def unpack(kit, work):
        work.mkdir(parents=True, exist_ok=True)
        now[0] += 15

    def prepare(command):
        now[0] += 60

    interrupted_after = []

    def run_until(command, stop_after, log):
        interrupted_after.append(stop_after)
        now[0] += stop_after
        return 0

    monkeypatch.setattr(real_scale, "unpack", unpack)
    monkeypatch.setattr(real_scale, "prepare", prepare)
    monkeypatch.setattr(real_scale, "run_until", run_until)
    monkeypatch.setattr(real_scale, "bring_back", lambda compare_dir, out: [])
    monkeypatch.setattr(real_scale, "machine", lambda: {})
    monkeypatch.setattr(real_scale.harness, "Run", lambda *a, **k: types.SimpleNamespace(save=lambda **fields: None))
    (tmp_path / "kit" / "tokenizer").mkdir(parents=True)
    args = argparse.Namespace(presets=real_scale.PRESETS, dry_run=False, smoke=True, kit=tmp_path / "kit",
                              work=tmp_path / "work", out=tmp_path / "out", limit=540.0, budget=None, stop_after=None,
                              eval_samples=32, compile=False)
    assert real_scale.run(args) == 0
    status = json.loads((args.out / "real_scale.json").read_text())
    # no GPU here: the kernel's warm-up has nothing to compile, and the call does not wait for it
    assert status["phases"] == {"before this script": 30.0, "unpack": 15.0, "prepare": 60.0, real_scale.WARM_PHASE: 0}
    assert status["warm_up"] == "skipped: no GPU here, so no model takes the kernel"
    grace, back, overhead = real_scale.INTERRUPT_GRACE, real_scale.BRING_BACK, real_scale.MODEL_OVERHEAD
    assert status["budget"] == f"{int((540 - 105 - back - grace - 2 * overhead) / 2 / real_scale.WALL_PER_BUDGET)}s"
    assert interrupted_after == [540 - 105 - back - grace]  # the models' training and overhead, nothing more
    assert "--time-budget" in status["command"]


class FakeComparison:
    """A comparison process that runs past its stop, then ends within `ends_after` seconds of an interrupt (None:
    never, until killed); it records the signals and waits it was given."""

    def __init__(self, ends_after):
        self.ends_after, self.events = ends_after, []

    def wait(self, timeout=None):
        self.events.append(("wait", timeout))
        interrupted = any(event[0] == "signal" for event in self.events)
        if ("kill",) in self.events:
            return -9
        if interrupted and self.ends_after is not None and timeout >= self.ends_after:
            return 130
        raise subprocess.TimeoutExpired("compare", timeout)

    def send_signal(self, number):
        self.events.append(("signal", number))

    def kill(self):
        self.events.append(("kill",))


@pytest.mark.parametrize(("ends_after", "code", "killed"), [(5.0, 130, False), (None, -9, True)])
def test_the_comparison_is_interrupted_as_ctrl_c_does_and_killed_only_past_the_grace(real_scale, monkeypatch,
                                                                                     ends_after, code, killed):
    """Ctrl-C's signal lets the comparison end its step and keep its checkpoint; it has the grace to do so (the
    plan counts it) and is killed only after."""
    process = FakeComparison(ends_after)
    monkeypatch.setattr(real_scale.subprocess, "Popen", lambda *args, **kwargs: process)
    assert real_scale.run_until(["compare"], 300.0, None) == code
    grace = real_scale.INTERRUPT_GRACE
    expected = [("wait", 300.0), ("signal", signal.SIGINT), ("wait", grace)]
    assert process.events == expected + ([("kill",), ("wait", None)] if killed else [])


def glue_result(scores: dict[str, tuple[float, float]]) -> dict:
    """glue_results.json's shape: every column already x 100, mean and SEM over 3 fine-tuning seeds."""
    columns = {name: {"mean": mean, "sem": sem, "std": sem * 3 ** 0.5, "n": 3} for name, (mean, sem) in scores.items()}
    means = [mean for mean, _ in scores.values()]
    return {"columns": columns, "glue": {"mean": sum(means) / len(means), "sem": 0.25, "n": 3}}


EVALUATIONS = [{"step": 500, "perplexity": 90.0, "tokens_seen": 5_000_000, "training_compute_seconds": 60.0},
               {"step": 1000, "perplexity": 41.25, "tokens_seen": 10_240_000, "training_compute_seconds": 121.4}]


def test_the_glue_table_sets_each_model_beside_the_papers_row_of_its_preset(real_scale, tmp_path):
    composite = tmp_path / "chang2021-small--composite"
    composite.mkdir()
    (composite / "metrics.jsonl").write_text("\n".join(json.dumps(e) for e in EVALUATIONS) + '\n{"step": 1000}\n')
    results = {"chang2021-small--composite": glue_result({"CoLA": (7.66, 0.77), "MRPC": (70.6, 0.97),
                                                          "SST": (78.7, 0.1)})
               | {"pretraining": real_scale.last_evaluation(composite)},
               "chang2021-small--rotary": glue_result({"CoLA": (9.0, 1.0), "MRPC": (71.0, 1.0), "SST": (79.0, 0.2)})
               | {"pretraining": real_scale.last_evaluation(tmp_path / "none")}}
    table = real_scale.glue_table(results).splitlines()
    rows = {(line.split(" | ")[0][2:], line.split(" | ")[1]): line for line in table if line.startswith("| chang")}
    assert set(rows) == {("chang2021-small--composite", "ours"), ("chang2021-small--composite", "Chang et al."),
                         ("chang2021-small--rotary", "ours")}  # the paper has no rotary row
    # the scores as they are (x 100 already), with the model's last evaluation beside them
    assert rows["chang2021-small--composite", "ours"] == (
        "| chang2021-small--composite | ours | 7.7 ± 0.8 (n 3) | 70.6 ± 1.0 (n 3) | 78.7 ± 0.1 (n 3) | "
        "52.3 ± 0.2 (n 3) | – | 41.2 | 1,000 | 10.2M (0.5% of theirs) | 121 s |")
    # Table 6's dev scores and their mean, Table 1's test GLUE
    assert rows["chang2021-small--composite", "Chang et al."].startswith(
        "| chang2021-small--composite | Chang et al. | 40.9 ± 0.7 | 86.2 ± 0.3 | 86.9 ± 0.1 | 71.3 | 75.2 |")
    assert rows["chang2021-small--rotary", "ours"].endswith("| – | – | – | – | – |")  # no metrics.jsonl given


def test_a_later_calls_model_joins_the_table_without_fine_tuning_the_earlier_ones_again(real_scale, tmp_path,
                                                                                       monkeypatch):
    """glue --models <a call's files>: the models already in --out's glue.json stay in the table with their
    pretraining; the given ones are fine-tuned (again, if they were there) and added."""
    fine_tuned = []

    def join_models(folder, models):
        model = models / f"chang2021-small--{folder.name}"
        model.mkdir(parents=True, exist_ok=True)
        (model / "metrics.jsonl").write_text(json.dumps(EVALUATIONS[-1]) + "\n")
        return [model]

    def convattn_glue(command, cwd, check):
        model = Path(command[command.index("--model") + 1])
        output = Path(command[command.index("--output-dir") + 1])
        output.mkdir(parents=True, exist_ok=True)
        fine_tuned.append(model.name)
        scores = {"CoLA": (len(fine_tuned), 1.0), "MRPC": (70.0, 1.0), "SST": (80.0, 0.5)}
        (output / real_scale.GLUE_RESULTS).write_text(json.dumps(glue_result(scores)))

    monkeypatch.setattr(real_scale, "join_models", join_models)
    monkeypatch.setattr(real_scale.subprocess, "run", convattn_glue)
    monkeypatch.setattr(real_scale.harness.Run, "save", lambda self, **row: None)
    args = argparse.Namespace(data_dir=tmp_path, work=tmp_path / "work", out=tmp_path / "out", tasks="cola,mrpc,sst2",
                              seeds=3, max_train_samples=20000, max_steps=None,
                              models=[tmp_path / "absolute", tmp_path / "composite"])
    assert real_scale.glue(args) == 0
    args.models = [tmp_path / "rotary"]
    assert real_scale.glue(args) == 0
    assert fine_tuned == ["chang2021-small--absolute", "chang2021-small--composite", "chang2021-small--rotary"]
    results = json.loads((args.out / "glue.json").read_text())
    assert list(results) == ["chang2021-small--absolute", "chang2021-small--composite", "chang2021-small--rotary"]
    table = (args.out / "glue.md").read_text()
    for row, cola in (("absolute", 1), ("composite", 2), ("rotary", 3)):
        assert f"| chang2021-small--{row} | ours | {cola:.1f} ± 1.0 (n 3) |" in table
    assert table.count("| 41.2 | 1,000 | 10.2M") == 3  # each model's pretraining, the earlier ones' from glue.json
    args.models = [tmp_path / "composite"]  # given again: fine-tuned again, its place in the table kept
    assert real_scale.glue(args) == 0
    assert fine_tuned[-1] == "chang2021-small--composite"
    assert list(json.loads((args.out / "glue.json").read_text()))[1] == "chang2021-small--composite"
    assert "| chang2021-small--composite | ours | 4.0 ± 1.0 (n 3) |" in (args.out / "glue.md").read_text()


def test_the_warm_up_reaches_the_kernel_as_the_trainings_and_evaluations_batches_do(real_scale, monkeypatch):
    """Each batch shape once in training (dropout, then the backward) and once in evaluation (neither): a batch
    without padding (no key mask), with padding, and padded to a length that is not a multiple of 16, each a kernel
    that Triton compiles apart. A model that does not take the kernel (the CPU's default) is left alone."""
    from convattn import padding_free
    from convattn.attention.relative.triton import operator

    monkeypatch.setattr(padding_free, "UNPAD_BELOW_REAL_FRACTION", {})  # as on a GPU: padded batches stay padded
    calls, backward = [], []
    forward, gradients = operator.run_forward, operator.run_backward
    monkeypatch.setattr(operator, "run_forward", lambda *args: calls.append(
        (args[0].shape[-2], args[5] is not None, args[11] > 0)) or forward(*args))
    monkeypatch.setattr(operator, "run_backward", lambda *args: backward.append(args[1].shape[-2]) or gradients(
        *args))
    batches = ((16, (16,)), (16, (16, 9)), (12, (12, 5)))
    composite = ["chang2021-small/composite"]
    assert real_scale.warm_passes(composite, batches, batch_size=2, smoke=True,
                                  attn_implementation="convattn_triton") == composite
    assert calls == [(16, False, True), (16, False, False), (16, True, True), (16, True, False), (12, True, True),
                     (12, True, False)]
    assert backward == [16, 16, 12]
    assert real_scale.warm_passes(composite, batches, batch_size=2, smoke=True) == []  # SDPA on CPU: nothing


def test_the_warm_up_reaches_the_kernel_that_a_gpu_takes_by_default_under_sdpas_name(real_scale, monkeypatch):
    """On a GPU a model with relative terms takes the kernel by default while its attn_implementation stays "sdpa"
    (the 2026-11-30 call's warm-up read the name, warmed nothing, and composite's first step compiled for 22 s of
    its training clock): the warm-up counts the kernel's launches instead. The absolute model runs SDPA."""
    from convattn import padding_free
    from convattn.attention.relative import dispatch
    from convattn.attention.relative.triton import operator

    monkeypatch.setattr(padding_free, "UNPAD_BELOW_REAL_FRACTION", {})
    monkeypatch.setattr(dispatch, "_triton_serves", lambda implementation, device, dtype: True)  # CUDA's default
    calls = []
    forward = operator.run_forward
    monkeypatch.setattr(operator, "run_forward", lambda *args: calls.append(args[0].shape[-2]) or forward(*args))
    presets = ["chang2021-small/absolute", "chang2021-small/composite"]
    assert real_scale.warm_passes(presets, ((16, (16, 9)),), batch_size=2, smoke=True) == presets[1:]
    assert calls == [16, 16]  # composite's training step and evaluation


@pytest.mark.parametrize("finishes", [True, False], ids=["finishes", "stopped"])
def test_the_warm_up_compiles_its_units_side_by_side_then_tunes_and_is_stopped_at_its_limit(real_scale, tmp_path,
                                                                                          monkeypatch, finishes):
    """On a GPU: a process per share of the (tiling, batch) units, then one tuning pass once all have compiled; past
    WARM_LIMIT from the call's start whatever still runs is stopped and the call goes on (the training compiles
    the rest). Here the processes are stand-ins that print their units, or sleep past the limit."""
    import sys

    import kernel_tilings
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kernel_tilings, "tiling_count", lambda head_dim, dtype: 2)
    monkeypatch.setattr(real_scale, "WARM_PROCESSES", 4)
    started = []

    def command(self, *options):
        started.append(options)
        body = f"print({' '.join(options)!r}, flush=True)" if finishes else "import time; time.sleep(120)"
        return [sys.executable, "-c", body]

    monkeypatch.setattr(real_scale.WarmUp, "_command", command)
    args = argparse.Namespace(presets=real_scale.PRESETS, smoke=False)
    log = tmp_path / "compare.log"
    warmup = real_scale.WarmUp(args, log, time.time() - real_scale.WARM_LIMIT + (3600 if finishes else 1))
    while not finishes and len(warmup.processes) < 4:  # its compiling processes started, however slowly: then stop
        time.sleep(0.05)
    outcome = warmup.finish()
    if finishes:
        assert outcome == "done"
        assert started == [("--units", "0:0,1:1"), ("--units", "0:1,1:2"), ("--units", "0:2"), ("--units", "1:0"),
                           ("--tune",)]
        said = log.read_text()  # the processes' lines, in whatever order they wrote them
        assert all(said.count(f"{' '.join(options)}") == 1 for options in started)
    else:
        assert outcome.startswith(f"stopped at {real_scale.WARM_LIMIT} s from the call's start")
        assert len(started) == 4 and all(process.poll() is not None for process in warmup.processes)


def test_a_warm_up_that_cannot_start_says_why_and_the_call_goes_on(real_scale, tmp_path, monkeypatch):
    """The kernel's tilings unknown (its launch module renamed what kernel_tilings pins): the outcome says so."""
    import kernel_tilings
    import torch

    def unknown(head_dim, dtype):
        raise kernel_tilings.TilingsUnknown("the kernel's launch module has no configs")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kernel_tilings, "tiling_count", unknown)
    warmup = real_scale.WarmUp(argparse.Namespace(presets=real_scale.PRESETS, smoke=False), tmp_path / "log",
                               time.time())
    assert warmup.finish() == "failed: TilingsUnknown: the kernel's launch module has no configs"
