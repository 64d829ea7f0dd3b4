"""`convattn compare` reports no non-finite number as one, refuses a row whose options its data cannot train, and
never takes the remains of an interrupted --overwrite for its output (issue 51)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers.folders import entries, one_error_line, snapshot
from helpers.pretrain import write_corpus

from convattn.cli import main
from convattn.runs.folder import PARTIAL, REPLACED

PRESETS = ["chang2021-small/absolute", "chang2021-small/composite"]
TINY = ["--layers", "2", "--hidden", "32", "--heads", "4", "--intermediate", "64", "--embedding-size", "16",
        "--vocab-size", "150", "--seq-len", "32", "--batch-size", "8", "--max-steps", "4", "--eval-every", "2",
        "--save-every", "2", "--warmup", "1", "--eval-samples", "16"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"), train_lines=100, eval_lines=20)


def compare_args(corpus: Path, out: Path, *extra: str, presets: list[str] = PRESETS, seeds: int = 2) -> list[str]:
    return ["compare", "--presets", ",".join(presets), "--seeds", str(seeds), *TINY, "--train-file",
            str(corpus / "train.txt"), "--eval-file", str(corpus / "valid.txt"), "--output-dir", str(out), *extra]


def finished_seed(folder: Path, perplexities: list[float], record: bool = False) -> Path:
    """A pretraining seed folder as a finished run leaves it, as far as the report reads it: its metrics (one row
    per evaluation) and its final model (`record`: and an options file, the record --overwrite looks for)."""
    folder.mkdir(parents=True)
    rows = [{"step": 2 * i, "perplexity": value, "eval_loss": math.log(value) if value > 0 else value,
             "train_loss": 5.0, "tokens_per_second": 1000.0, "tokens_seen": 640 * i}
            for i, value in enumerate(perplexities)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))  # NaN as JSON's NaN
    if record:
        (folder / "pretrain_options.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def comparison(out: Path, finals: dict[str, list[float]]) -> Path:
    """A comparison folder whose runs finished with these final perplexities (per seed)."""
    out.mkdir(parents=True)
    (out / "compare.json").write_text('{"written_by": "convattn compare"}')
    for preset, values in finals.items():
        for seed, value in enumerate(values):
            finished_seed(out / "runs" / preset.replace("/", "--") / f"seed{seed}", [120.0, 80.0, value])
    return out


NON_FINITE = [pytest.param(float("nan"), id="nan"), pytest.param(float("inf"), id="inf")]


@pytest.mark.parametrize("extra", [[], ["--report-only"]], ids=["training", "report-only"])
@pytest.mark.parametrize("bad", NON_FINITE)
def test_a_non_finite_perplexity_is_refused_before_anything_is_written(corpus, tmp_path, capsys, bad, extra):
    """A run's metrics are read before any run trains (not after hours, at the report): a perplexity that is
    not a finite number is never reported as one."""
    out = comparison(tmp_path / "out", {PRESETS[0]: [bad, 40.0], PRESETS[1]: [30.0, 32.0]})
    before = snapshot(out)
    assert main(compare_args(corpus, out, *extra)) == 2
    one_error_line(capsys.readouterr().err, "compare", "chang2021-small--absolute/seed0/metrics.jsonl:3",
                   "'perplexity'")
    assert snapshot(out) == before


@pytest.mark.parametrize("extra", [[], ["--report-only"]], ids=["training", "report-only"])
def test_a_non_finite_fine_tuning_score_is_refused_never_reported_as_a_number(corpus, tmp_path, capsys, extra):
    """glue scores an undefined correlation 0 now (a constant STS-B prediction, said as a warning); a NaN in an
    older results file is refused, naming the folder to fine-tune again."""
    out = comparison(tmp_path / "out", {PRESETS[0]: [40.0, 41.0], PRESETS[1]: [30.0, 32.0]})
    glue = out / "runs" / PRESETS[0].replace("/", "--") / "seed1" / "glue"
    glue.mkdir()
    (glue / "glue_results.json").write_text(json.dumps({"columns": {"STS": {"mean": float("nan")}}}))
    before = snapshot(out)
    assert main(compare_args(corpus, out, *extra)) == 2
    one_error_line(capsys.readouterr().err, "compare", f"{glue}: the GLUE STS score is nan, not a finite number",
                   f"delete {glue} to fine-tune that seed again")
    assert snapshot(out) == before


def test_a_linformer_row_whose_projection_length_is_not_the_sequence_length_is_refused(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    linformer = "malard/linformer-n128-k32"
    assert main(compare_args(corpus, out, presets=[PRESETS[0], linformer], seeds=1)) == 2
    one_error_line(capsys.readouterr().err, "compare", f"run {linformer}: --seq-len 32 does not match the 128 "
                   "positions its Linformer projections (E/F, k=32) are sized to (max_position_embeddings)",
                   "give --seq-len 128")
    assert entries(out) == []


@pytest.mark.parametrize("steps", [["--glue", "sst2", "--glue-max-steps", "1"],
                                   ["--squad", "1.1", "--squad-max-steps", "1"]], ids=["glue", "squad"])
def test_a_fine_tuning_request_that_would_train_nothing_is_refused_before_pretraining(corpus, tmp_path, capsys, steps):
    out = tmp_path / "out"
    assert main(compare_args(corpus, out, *steps)) == 2
    one_error_line(capsys.readouterr().err, "compare", f"{steps[2]} 1 trains nothing", f"give {steps[2]} 2 or more")
    assert entries(out) == []


@pytest.mark.parametrize("remains", [REPLACED, PARTIAL])
def test_a_folder_holding_only_a_replaced_runs_remains_is_refused_and_left_alone(corpus, tmp_path, capsys, remains):
    out = tmp_path / "out"
    finished_seed(out / remains, [100.0, 50.0], record=True)  # a run an interrupted --overwrite kept aside
    before = snapshot(out)
    for extra in ([], ["--report-only"]):
        assert main(compare_args(corpus, out, *extra)) == 2
        one_error_line(capsys.readouterr().err, "compare", f"{out} holds {remains}/", "interrupted",
                       "run that command again to get it back")
        assert snapshot(out) == before


def test_a_seed_folder_left_by_a_killed_overwrite_gets_its_run_back_before_its_state_is_read(corpus, tmp_path,
                                                                                          capsys):
    """A finished seed a killed `pretrain --overwrite` kept aside is back, and reported (so also reused, not
    trained over), as pretrain itself would recover it."""
    out = comparison(tmp_path / "out", {PRESETS[0]: [40.0], PRESETS[1]: [30.0]})
    seed = out / "runs" / PRESETS[0].replace("/", "--") / "seed0"
    (seed / "pretrain_options.json").write_text(json.dumps(options_of(compare_args(corpus, out, seeds=1))))
    kept = snapshot(seed)
    aside = seed.parent / "aside"
    seed.rename(aside)
    seed.mkdir()
    aside.rename(seed / REPLACED)
    (seed / "pretrain_options.json").write_text('{"new": 1}')  # the replacement's first file
    assert main(compare_args(corpus, out, "--report-only", seeds=1)) == 0
    assert "the earlier run is back as it was" in capsys.readouterr().err
    assert snapshot(seed) == kept
    assert "| 40.00 |" in (out / "report.md").read_text()


def options_of(argv: list[str]) -> dict:
    """The options the first run of a comparison records (pretrain_options.json)."""
    from convattn.cli import build_parser
    from convattn.commands.compare_flags import compare_options
    from convattn.training.compare.grids import grid_from_presets
    from convattn.training.compare.options import run_options

    options = compare_options(build_parser().parse_args(argv), grid_from_presets(PRESETS), Path("unused"))
    return run_options(options, options.grid.runs[0], 0).to_json()


def test_eval_text_that_is_training_text_is_refused_before_any_run(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    args = compare_args(corpus, out)
    args[args.index(str(corpus / "valid.txt"))] = str(corpus / "train.txt")
    assert main(args) == 2
    one_error_line(capsys.readouterr().err, "compare", f"--eval-file {corpus / 'train.txt'} is the same file as "
                   f"--train-file {corpus / 'train.txt'}", "eval text is training text", "--allow-eval-overlap")
    assert not out.exists()


def test_a_length_given_twice_is_refused_not_reported_as_two_columns():
    from convattn.errors import UsageError
    from convattn.training.compare.lengths import parse_lengths

    assert parse_lengths("32,64") == [32, 64]
    with pytest.raises(UsageError, match=r"'32,64,32': 32 given more than once .* give each length once"):
        parse_lengths("32,64,32")
