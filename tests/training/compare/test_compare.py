"""`convattn compare` and `convattn plot kernel-size` end to end on tiny configs: report files, fairness, reuse."""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import types
from pathlib import Path

import pytest
from helpers.pretrain import WORDS, main_offline, write_corpus

from convattn.cli import main
from convattn.presets import preset_fields, preset_names
from convattn.training.compare import job as compare
from convattn.training.compare.grids import grid_names, load_grid

PRESETS = ["chang2021-small/absolute", "chang2021-small/composite"]
TINY = ["--layers", "2", "--hidden", "32", "--heads", "4", "--intermediate", "64", "--embedding-size", "16",
        "--vocab-size", "150", "--seq-len", "32", "--batch-size", "8", "--max-steps", "4", "--eval-every", "2",
        "--save-every", "2", "--log-every", "1", "--warmup", "1", "--eval-samples", "16"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"), train_lines=400, eval_lines=40)


def compare_args(corpus, out, *extra: str, presets: str = ",".join(PRESETS)) -> list[str]:
    return ["compare", "--presets", presets, "--seeds", "2", *TINY, "--train-file", str(corpus / "train.txt"),
            "--eval-file", str(corpus / "valid.txt"), "--output-dir", str(out), *extra]


@pytest.fixture(scope="module")
def compared(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "out"
    assert main_offline(compare_args(corpus, out), tmp_path_factory) == 0
    return out


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def metrics_rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_report_files_and_rows(compared):
    for name in ("report.md", "report.html", "metrics.csv", "summary.csv"):
        assert (compared / name).stat().st_size > 0, name
    assert (compared / "perplexity.png").read_bytes()[:4] == b"\x89PNG"
    metrics = read_csv(compared / "metrics.csv")
    assert len(metrics) == 2 * 2 * 3  # presets x seeds x evaluations (steps 0, 2, 4)
    assert {(row["run"], row["seed"], row["step"]) for row in metrics} == {
        (preset, str(seed), str(step)) for preset in PRESETS for seed in (0, 1) for step in (0, 2, 4)}
    summary = read_csv(compared / "summary.csv")
    assert [row["run"] for row in summary] == PRESETS
    for row in summary:
        finals = [metrics_rows(compared / "runs" / row["run"].replace("/", "--") / f"seed{s}")[-1]["perplexity"]
                  for s in (0, 1)]
        assert row["seeds_finished"] == "2" and row["final_step"] == "4"
        assert float(row["perplexity_mean"]) == pytest.approx(statistics.fmean(finals), abs=1e-3)
        assert float(row["perplexity_std"]) == pytest.approx(statistics.stdev(finals), abs=1e-3)
        assert int(row["encoder_parameters"]) > 0 and float(row["train_memory_mib"]) > 0
        assert float(row["tokens_per_second"]) > 0
    report = (compared / "report.md").read_text()
    assert all(f"| {preset} |" in report for preset in PRESETS)
    assert "sample standard deviation" in report and "](perplexity.png)" in report
    assert "<table>" in (compared / "report.html").read_text()


def test_runs_share_tokenizer_and_data_order(compared):
    tokenizers = set()
    for seed in (0, 1):
        seen = []
        for preset in PRESETS:
            run = compared / "runs" / preset.replace("/", "--") / f"seed{seed}"
            assert (run / "model.safetensors").is_file() and (run / "tokenizer.json").is_file()
            options = json.loads((run / "pretrain_options.json").read_text())
            assert options["seed"] == seed and options["max_steps"] == 4
            tokenizers.add(options["tokenizer"])
            seen.append([row["tokens_seen"] for row in metrics_rows(run)])
        assert seen[0] == seen[1]  # the same batches, in the same order, for every preset at one seed
    assert tokenizers == {str((compared / "tokenizer").resolve())}


def test_second_invocation_reuses_finished_runs(compared, corpus, monkeypatch, capsys):
    models = sorted(compared.glob("runs/*/seed*/model.safetensors"))
    before = [path.stat().st_mtime_ns for path in models]

    def no_training(options, label):
        raise AssertionError(f"retrained {options.output_dir}")

    monkeypatch.setattr(compare, "pretrain", no_training)
    assert main(compare_args(corpus, compared)) == 0
    assert [path.stat().st_mtime_ns for path in models] == before
    assert "4 reused" in capsys.readouterr().err


def test_unfinished_run_resumes_from_its_checkpoint(compared, corpus, monkeypatch):
    run = compared / "runs" / "chang2021-small--composite" / "seed1"
    (run / "model.safetensors").unlink()
    calls, real_pretrain = [], compare.pretrain

    def recording(options, label):
        calls.append((options.output_dir, options.resume))
        return real_pretrain(options, label=label)

    monkeypatch.setattr(compare, "pretrain", recording)
    assert main(compare_args(corpus, compared)) == 0
    assert calls == [(run, True)]
    assert (run / "model.safetensors").is_file()


def test_ctrl_c_in_a_run_ends_the_comparison_there(compared, corpus, monkeypatch, tmp_path):
    """An interrupted run (Ctrl-C, SIGTERM: its checkpoint kept) stops the comparison; the runs after it are not
    started, and the command exits 130 as an interrupted command does."""
    unfinished = [compared / "runs" / slug / "seed1" for slug in ("chang2021-small--absolute",
                                                                  "chang2021-small--composite")]
    calls = []

    def interrupted(options, label):
        calls.append(options.output_dir)
        return types.SimpleNamespace(interrupted=True)

    monkeypatch.setattr(compare, "pretrain", interrupted)
    for index, run in enumerate(unfinished):  # set aside, so both runs read as unfinished; back after the test
        (run / "model.safetensors").replace(tmp_path / f"{index}.safetensors")
    try:
        assert main(compare_args(corpus, compared)) == 130
    finally:
        for index, run in enumerate(unfinished):
            (tmp_path / f"{index}.safetensors").replace(run / "model.safetensors")
        assert main(compare_args(corpus, compared, "--report-only")) == 0  # the report of finished runs again
    assert calls == [unfinished[0]]


def test_changed_budget_is_refused(compared, corpus, capsys):
    assert main(compare_args(corpus, compared, "--max-steps", "6")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "max_steps: 4 -> 6" in err


def test_shared_tokenizer_of_other_settings_is_refused(compared, corpus, capsys):
    args = compare_args(corpus, compared, presets="chang2021-small/fixed")
    assert main([*args, "--vocab-size", "140"]) == 2
    assert "tokenizer was trained for other text or vocabulary" in capsys.readouterr().err


def test_report_only_rebuilds_from_the_run_directories(compared, monkeypatch):
    (compared / "report.md").unlink()
    monkeypatch.setattr(compare, "pretrain", lambda options: pytest.fail("trained"))
    assert main(["compare", "--presets", ",".join(PRESETS), "--output-dir", str(compared), "--report-only"]) == 0
    report = (compared / "report.md").read_text()
    assert "| chang2021-small/absolute |" in report and "| 2/2 |" in report  # seeds found in the directories
    assert "4 steps x batch 8 x 32 tokens" in report  # the budget the runs were trained with, not the recipe's
    assert "- **machine**: cpu (" in report and "(every run, seed and resume)" in report


def test_the_report_names_starts_whose_settings_moved(compared, monkeypatch, tmp_path):
    """A seed resumed with other threads is named with what moved: its tokens/s is not comparable."""
    copy = tmp_path / "out"
    shutil.copytree(compared, copy)
    environment = copy / "runs" / "chang2021-small--composite" / "seed1" / "environment.jsonl"
    first = json.loads(environment.read_text().splitlines()[0])
    environment.write_text(environment.read_text() + json.dumps(dict(first, step=2, threads=first["threads"] + 3))
                           + "\n")
    monkeypatch.setattr(compare, "pretrain", lambda options: pytest.fail("trained"))
    assert main(["compare", "--presets", ",".join(PRESETS), "--output-dir", str(copy), "--report-only"]) == 0
    report = (copy / "report.md").read_text()
    threads = first["threads"]
    assert (f"other settings in chang2021-small/composite seed 1 from step 2: threads {threads} -> {threads + 3}"
            in report), report


def test_the_report_names_starts_that_ran_other_code(compared, monkeypatch, tmp_path):
    """A seed resumed by other convattn code (its digest moved) is named: its numbers may come from other code."""
    copy = tmp_path / "out"
    shutil.copytree(compared, copy)
    environment = copy / "runs" / "chang2021-small--absolute" / "seed0" / "environment.jsonl"
    first = json.loads(environment.read_text().splitlines()[0])
    environment.write_text(environment.read_text() + json.dumps(dict(first, step=2, convattn_source="0123456789ab"))
                           + "\n")
    monkeypatch.setattr(compare, "pretrain", lambda options: pytest.fail("trained"))
    assert main(["compare", "--presets", ",".join(PRESETS), "--output-dir", str(copy), "--report-only"]) == 0
    report = (copy / "report.md").read_text()
    assert ("- **code**: convattn's code differed between starts (its digest in environment.jsonl): "
            "chang2021-small/absolute seed 0 from step 2 ran other code than chang2021-small/absolute seed 0's "
            "first start") in report, report
    assert "(every run, seed and resume)" in report  # no setting moved
    assert "**code**" not in (compared / "report.md").read_text()


def test_report_only_of_a_subset_leaves_the_full_report_alone(compared, monkeypatch, capsys):
    monkeypatch.setattr(compare, "pretrain", lambda options: pytest.fail("trained"))
    full = {name: (compared / name).read_bytes() for name in ("report.md", "report.html", "summary.csv")}
    assert main(["compare", "--presets", PRESETS[1], "--output-dir", str(compared), "--report-only"]) == 0
    assert {name: (compared / name).read_bytes() for name in full} == full
    subset = next((compared / "subsets").iterdir())
    assert f"report: {subset / 'report.md'}" in capsys.readouterr().out
    report = (subset / "report.md").read_text()
    assert "| chang2021-small/composite |" in report and "| chang2021-small/absolute |" not in report


@pytest.mark.parametrize(
    ("selection", "needle"),
    [
        (["--grid", "nope"], "unknown grid 'nope'; choose --grid from chang2021-small, convbert, malard-n512"),
        (["--presets", " , "], "no runs to compare"),
        (["--presets", "chang2021-small/nope"], "chang2021-small/{none,absolute,"),
        (["--presets", "chang2021-small/none,chang2021-small/none"], "listed more than once"),
        (["--presets", "chang2021-small/none", "--glue", "sst2", "--glue-max-steps", "10000000000"],
         "--glue-max-steps 10000000000 must be an integer from 1 to 1,000,000,000"),
    ],
)
def test_bad_selection_exits_2_with_one_line(tmp_path, capsys, selection, needle):
    out = tmp_path / "out"
    assert main(["compare", *selection, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("convattn compare: error:") and needle in err
    assert not out.exists()


def files_in(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("extra", [[], ["--report-only"]])
def test_a_folder_holding_the_users_files_is_refused_and_left_alone(corpus, tmp_path, capsys, extra):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my report")
    (out / "metrics.csv").write_text("step,loss\n1,2\n")
    before = files_in(out)
    assert main(compare_args(corpus, out, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("convattn compare: error: --output-dir")
    assert "metrics.csv, report.md" in err and "did not write" in err
    assert files_in(out) == before and sorted(p.name for p in out.iterdir()) == ["metrics.csv", "report.md"]


def test_a_folder_another_convattn_process_writes_is_refused(corpus, tmp_path, capsys):
    from convattn.runs.folder import run_folder_lock

    out = tmp_path / "busy"
    with run_folder_lock(out):  # a pretrain (or another compare) writing there
        assert main(compare_args(corpus, out)) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "in use by another convattn run" in err
        assert [p.name for p in out.iterdir()] == [".convattn.lock"]


def test_a_comparison_folder_is_continued(compared):
    assert (compared / "compare.json").is_file()


@pytest.mark.parametrize("name", grid_names())
def test_shipped_grids_load_and_name_real_presets(name):
    grid = load_grid(name)
    assert grid.runs and grid.recipe and grid.description
    assert {run.preset for run in grid.runs} <= set(preset_names())


def test_chang2021_small_grid_has_every_composite_paper_row():
    beyond = {"convbert", "rotary", "alibi", "composite+rotary"}  # not among the paper's 14 composite rows
    expected = [p for p in preset_names() if p.startswith("chang2021-small/") and p.split("/")[1] not in beyond]
    assert [run.preset for run in load_grid("chang2021-small").runs] == expected and len(expected) == 14


def test_positions_grid_runs_every_position_encoding_at_one_size():
    runs = [run.preset.split("/")[1] for run in load_grid("positions").runs]
    assert runs == ["none", "absolute", "fixed", "dynamic", "composite", "composite+key", "rotary", "alibi",
                    "composite+rotary", "convbert"]
    assert {preset_fields(f"chang2021-small/{run}")["position_embedding_type"] for run in runs} == {
        "none", "absolute", "rotary", "alibi"}


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def test_activation_memory_grows_with_the_batch():
    from convattn.training.compare.memory import training_memory
    from convattn.training.recipes import Recipe

    tokenizer = word_tokenizer()
    model = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64,
             "embedding_size": 16}
    small, large = (training_memory(Recipe("chang2021-small/composite", batch_size=batch, seq_len=32,
                                                   model=model), tokenizer) for batch in (4, 8))
    assert small["state_bytes"] == large["state_bytes"] == 16 * small["parameters"]
    assert 1.7 < large["activation_bytes"] / small["activation_bytes"] < 2.3


@pytest.mark.slow
def test_kernel_size_sweep_writes_its_figure(corpus, tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["plot", "kernel-size", "--kernel-sizes", "3,1", "--seeds", "1", *TINY, "--max-steps", "2",
            "--train-file", str(corpus / "train.txt"), "--eval-file", str(corpus / "valid.txt"),
            "--output-dir", str(out)]
    assert main(args) == 0
    assert (out / "kernel_size.png").read_bytes()[:4] == b"\x89PNG"
    assert [row["run"] for row in read_csv(out / "summary.csv")] == ["k=1", "k=3"]
    for k in (1, 3):
        config = json.loads((out / "runs" / f"k={k}" / "seed0" / "config.json").read_text())
        assert config["conv_kernel_size"] == k and config["head_ratio"] == 2
    printed = capsys.readouterr().out
    assert str(out / "kernel_size.png") in printed
    assert "k=3 seed 0: step 0: eval perplexity" in printed  # each run's evaluation lines name it


def test_kernel_size_sweep_rejects_even_sizes_and_non_convbert_presets(capsys):
    assert main(["plot", "kernel-size", "--kernel-sizes", "3,4"]) == 2
    assert "odd sizes" in capsys.readouterr().err
    assert main(["plot", "kernel-size", "--preset", "chang2021-small/composite"]) == 2
    assert "no ConvBERT convolution" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_lengths_scores_relative_runs_past_the_trained_length(compared, corpus, capsys):
    # trained on 32-token examples; absolute positions stop at the preset's 128, relative positions run past it
    args = ["compare", "--presets", ",".join(PRESETS), "--output-dir", str(compared), "--report-only",
            "--eval-file", str(corpus / "valid.txt"), "--eval-lengths", "16,160"]
    assert main(args) == 0
    rows = read_csv(compared / "lengths.csv")
    by_run = {(r["run"], r["seed"], r["length"]): r for r in rows}
    assert len(rows) == 2 * 2 * 2  # runs x seeds x lengths
    for seed in ("0", "1"):
        assert float(by_run["chang2021-small/composite", seed, "160"]["perplexity"]) > 1.0
        assert float(by_run["chang2021-small/absolute", seed, "16"]["perplexity"]) > 1.0
        absolute_long = by_run["chang2021-small/absolute", seed, "160"]
        assert absolute_long["perplexity"] == "" and "cannot extend" in absolute_long["note"]
    table = (compared / "lengths.md").read_text()
    assert "cannot extend: absolute position embeddings stop at 128" in table
    assert (compared / "lengths.png").stat().st_size > 0
    cached = json.loads((compared / "runs" / "chang2021-small--composite" / "seed0" / "length_eval.json").read_text())
    assert cached["lengths"] == [16, 160] and cached["max_blocks"] == 64

    # one block of 160 tokens: the text's first 158 tokens between [CLS] and [SEP], fewer than the default's
    assert main([*args, "--eval-length-blocks", "1"]) == 0
    one = {(r["run"], r["seed"], r["length"]): r for r in read_csv(compared / "lengths.csv")}
    assert 0 < int(one["chang2021-small/composite", "0", "16"]["masked_tokens"]) < int(
        by_run["chang2021-small/composite", "0", "16"]["masked_tokens"])
    assert one["chang2021-small/composite", "0", "160"]["perplexity"] != by_run["chang2021-small/composite", "0",
                                                                                 "160"]["perplexity"]


@pytest.mark.parametrize(("flags", "needle"), [
    (["--eval-lengths", "128,abc"], "comma-separated integers"), (["--eval-lengths", "2"], ">= 3"),
    (["--eval-lengths", "128", "--eval-length-blocks", "0"], "positive number of blocks"),
    (["--eval-length-blocks", "all"], "--eval-length-blocks sets the text --eval-lengths scores; give --eval-lengths")])
def test_eval_lengths_bad_values_exit_2(compared, flags, needle, capsys):
    args = ["compare", "--presets", ",".join(PRESETS), "--output-dir", str(compared), "--report-only", *flags]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_squad_columns_join_the_report(corpus, tmp_path):
    squad = Path(__file__).resolve().parents[2] / "fixtures" / "squad"
    out = tmp_path / "out"
    args = compare_args(corpus, out, "--squad", "1.1", "--squad-train-file", str(squad / "train-v1.1.json"),
                        "--squad-dev-file", str(squad / "dev-v1.1.json"), "--squad-max-steps", "2",
                        "--squad-max-length", "128", presets="chang2021-small/composite")
    args[args.index("--seeds") + 1] = "1"
    assert main(args) == 0
    assert (out / "runs" / "chang2021-small--composite" / "seed0" / "squad" / "squad_results.json").is_file()
    report = (out / "report.md").read_text()
    assert "| SQuAD v1.1 EM | SQuAD v1.1 F1 |" in report and "SQuAD: dev exact match" in report
    summary = read_csv(out / "summary.csv")[0]
    assert float(summary["SQuAD_v1.1_F1_mean"]) >= 0


def test_squad_flags_need_a_version(corpus, tmp_path, capsys):
    assert main(compare_args(corpus, tmp_path / "o", "--squad-max-steps", "3")) == 2
    assert "--squad-max-steps need(s) --squad VERSION" in capsys.readouterr().err


def test_perplexity_figure_reads_plain_numbers_and_labels_every_line():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from convattn.training.compare.grids import RunSpec
    from convattn.training.compare.results import RunResult, perplexity_figure

    # a narrow range above 10^4, as in the first few hundred steps of a large vocabulary
    results = [RunResult(RunSpec(name, name), {seed: [{"step": step, "perplexity": 14_000 - 900 * step / 100 + seed}
                                                       for step in (0, 100, 200, 300)] for seed in (0, 1)},
                         [0, 1], None, {}) for name in ("chang2021-small/none", "chang2021-small/composite")]
    fig = perplexity_figure(results, "test")
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels(minor=False) + ax.get_yticklabels(minor=True)]
    assert any(labels) and not any("e+" in label or "times" in label for label in labels)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["chang2021-small/none (2 seeds)", "chang2021-small/composite (2 seeds)"]


def test_the_report_names_the_vocabulary_built_not_the_one_asked(compared):
    built = json.loads((compared / "runs" / PRESETS[0].replace("/", "--") / "seed0" / "config.json").read_text())
    report = (compared / "report.md").read_text()
    assert built["vocab_size"] < 150 and f"(unigram, {built['vocab_size']:,} pieces" in report
    assert "150 pieces" not in report


def test_vocab_size_with_a_given_tokenizer_is_refused(corpus, tmp_path, capsys):
    assert main(compare_args(corpus, tmp_path / "out", "--tokenizer", str(corpus))) == 2  # TINY gives --vocab-size
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--vocab-size" in err[0] and "--tokenizer" in err[0], err
    assert not (tmp_path / "out").exists()


def bad_inputs(corpus: Path, tmp_path: Path) -> list[tuple[list[str], str]]:
    """(flags, what the line says): inputs a comparison reads only after hours of pretraining, checked first."""
    (tmp_path / "binary.txt").write_bytes(b"text\0more\n")
    glue_data = Path(__file__).resolve().parents[2] / "fixtures" / "glue_data"
    squad = glue_data.parent / "squad"
    bad_glue = Path(shutil.copytree(glue_data, tmp_path / "glue_data"))
    (bad_glue / "SST-2" / "train.tsv").write_text("sentence\tlabel\nfine words\tmaybe\n")
    return [
        (["--train-file", str(tmp_path / "binary.txt")], "binary.txt: a binary file, not text"),
        (["--glue", "sst2", "--glue-data-dir", str(bad_glue)], "train.tsv:2: unknown sst2 label 'maybe'"),
        (["--layers", "2", "--hidden", "4000000"], "training needs at least"),
        (["--glue", "sst2"], "could not load nyu-mll/glue (sst2, train) from the HF hub"),  # offline in the tests
        (["--squad", "2.0", "--squad-train-file", str(squad / "train-v1.1.json"), "--squad-dev-file",
          str(squad / "dev-v1.1.json")], "is a SQuAD 1.1 file"),
    ]


def test_bad_inputs_are_refused_before_anything_is_written(corpus, tmp_path, capsys):
    for extra, said in bad_inputs(corpus, tmp_path):
        out = tmp_path / "out"
        assert main(compare_args(corpus, out, *extra)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("convattn compare: error:") and said in err[-1], err
        assert not out.exists()


def test_a_runs_final_figures_are_its_finished_seeds_an_unfinished_one_says_its_own_step():
    """The perplexity, tokens seen and steps reached of a row are over the seeds that finished; a seed stopped part
    way (its last evaluation at an earlier step, a higher perplexity) is shown in the per-seed table, not averaged."""
    from convattn.training.compare.grids import RunSpec
    from convattn.training.compare.results import RunResult

    rows = {0: [{"step": 100, "perplexity": 400.0, "tokens_seen": 9_000}],
            1: [{"step": 40, "perplexity": 900.0, "tokens_seen": 3_000}],
            2: [{"step": 100, "perplexity": 420.0, "tokens_seen": 9_400}]}
    result = RunResult(RunSpec("absolute", "chang2021-small/absolute"), rows, [0, 2], None, {})
    assert result.final_perplexity["values"] == [400.0, 420.0] and result.final_perplexity["mean"] == 410.0
    assert (result.tokens_seen, result.steps_reached, result.final_step) == (9_200, 100, 100)
    assert result.curve_seeds == [0, 2]


def test_fine_tuning_columns_read_each_results_file_in_the_papers_order(tmp_path):
    """GLUE columns in the papers' order (not the alphabet's), then SQuAD; a v2.0 file's EM and F1 are the
    official evaluator's best_exact / best_f1 (at the dev-chosen no-answer threshold), a v1.1 file's exact_match /
    f1; summary.csv gives each row's perplexity SEM beside its std."""
    from convattn.training.compare.grids import RunSpec
    from convattn.training.compare.results import RunResult, downstream_columns, read_downstream, write_summary_csv

    def seed_folder(name, glue, squad):
        (tmp_path / name / "glue").mkdir(parents=True)
        (tmp_path / name / "glue" / "glue_results.json").write_text(json.dumps(
            {"columns": {column: {"mean": score} for column, score in glue.items()}}))
        (tmp_path / name / "squad").mkdir()
        (tmp_path / name / "squad" / "squad_results.json").write_text(json.dumps(squad))
        return read_downstream(tmp_path / name)

    scores = {"exact_match": {"mean": 50.0}, "f1": {"mean": 60.0}, "best_exact": {"mean": 55.0},
              "best_f1": {"mean": 64.0}}
    v2 = seed_folder("a", {"SST": 80.0, "CoLA": 20.0, "MRPC": 70.0}, {"version": "2.0", "scores": scores})
    assert (v2["SQuAD v2.0 EM"], v2["SQuAD v2.0 F1"]) == (55.0, 64.0)
    v1 = seed_folder("b", {"STS": 30.0, "RTE": 55.0}, {"version": "1.1", "scores": scores})
    assert (v1["SQuAD v1.1 EM"], v1["SQuAD v1.1 F1"]) == (50.0, 60.0)

    rows = {seed: [{"step": 10, "perplexity": perplexity, "tokens_seen": 900}]
            for seed, perplexity in enumerate((400.0, 430.0, 460.0))}
    results = [RunResult(RunSpec("absolute", "chang2021-small/absolute"), rows, [0, 1, 2], None, {0: v2, 1: v1})]
    assert downstream_columns(results) == ["GLUE CoLA", "GLUE MRPC", "GLUE RTE", "GLUE SST", "GLUE STS",
                                           "SQuAD v1.1 EM", "SQuAD v1.1 F1", "SQuAD v2.0 EM", "SQuAD v2.0 F1"]
    write_summary_csv(results, tmp_path / "summary.csv")
    row = read_csv(tmp_path / "summary.csv")[0]
    assert (float(row["perplexity_std"]), float(row["perplexity_sem"])) == (30.0, round(30.0 / 3 ** 0.5, 3))


def test_a_runs_tokens_per_second_is_the_mean_over_seeds_of_each_seeds_median_evaluation():
    """The report's throughput column: a seed's rate is the median over its evaluations (one slow or fast interval,
    such as the first, moves it little), the run's the mean of its seeds'; rows without a rate (step 0) are skipped."""
    from convattn.training.compare.grids import RunSpec
    from convattn.training.compare.results import RunResult

    rates = {0: [None, 900.0, 1000.0, 4000.0], 1: [None, 1200.0, 1100.0, 1300.0, 100.0]}
    rows = {seed: [{"step": 10 * k, "perplexity": 100.0, "tokens_per_second": rate} for k, rate in enumerate(values)]
            for seed, values in rates.items()}
    result = RunResult(RunSpec("absolute", "chang2021-small/absolute"), rows, [0, 1], None, {})
    assert result.tokens_per_second == pytest.approx((1000.0 + (1100.0 + 1200.0) / 2) / 2)
    assert RunResult(RunSpec("absolute", "chang2021-small/absolute"), {0: [{"step": 0, "tokens_per_second": None}]},
                     [0], None, {}).tokens_per_second is None
