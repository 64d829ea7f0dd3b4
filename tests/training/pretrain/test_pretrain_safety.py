"""`convattn pretrain` never loses a run or a user's file, owns its folder, and refuses impossible values."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
from pathlib import Path

import pytest
from helpers.pretrain import InterruptAt, main_offline, tiny_args, write_corpus

from convattn.cli import main
from convattn.runs.folder import LOCK_FILE, run_folder_lock


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "finished"
    assert main_offline(tiny_args(corpus, out, "--max-steps", "4", "--eval-every", "2"), tmp_path_factory) == 0
    return out


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under `folder`: its content hash and modification time."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys, *needles: str) -> str:
    """The error: the last line on stderr, and the only one that says error."""
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("convattn pretrain: error:") and err.count("error") == 1, err
    for needle in needles:
        assert needle in err, err
    return err


IMPOSSIBLE_VALUES = [
    (["--seq-len", "0"], "--seq-len 0"),
    (["--lr", "inf"], "--lr inf must be a finite number"),
    (["--lr", "1e309"], "--lr inf"),
    (["--lr", "nan"], "--lr nan"),
    (["--lr", "0"], "--lr 0"),
    (["--weight-decay", "nan"], "--weight-decay nan"),
    (["--weight-decay", "-1"], "--weight-decay -1"),
    (["--adam-epsilon", "0"], "--adam-epsilon 0"),
    (["--adam-epsilon", "nan"], "--adam-epsilon nan"),
    (["--max-grad-norm", "nan"], "--max-grad-norm nan"),
    (["--max-grad-norm", "-1"], "--max-grad-norm -1"),
    (["--warmup", "-3"], "--warmup -3"),
    (["--mlm-probability", "nan"], "--mlm-probability nan"),
    (["--mlm-probability", "1"], "--mlm-probability 1"),  # an open bound: every token masked
    (["--eval-samples", "0"], "--eval-samples 0"),
    (["--eval-samples", "-1"], "--eval-samples -1"),
    (["--seed", "-1"], "--seed -1"),
    (["--set", "layer_norm_eps=0"], "layer_norm_eps=0"),
    (["--set", "attention_probs_dropout_prob=.nan"], "attention_probs_dropout_prob=nan"),
    (["--set", "hidden_dropout_prob=1.5"], "hidden_dropout_prob=1.5"),
    (["--set", "hidden_act=foo"], "hidden_act='foo' is not allowed"),
    (["--vocab-size", "1000000000"], "--vocab-size 1,000,000,000 is above 1,000,000"),
    (["--dataset-config", "x"], "--dataset-config x needs --dataset"),
    (["--precision", "fp16"], "--precision fp16 needs a GPU here"),
    (["--set", "relative_terms=[fixed"], "--set 'relative_terms=[fixed': the value is not valid YAML"),
    (["--hidden", "4000000"], "--layers 2, --hidden 4000000, --intermediate 64): training needs at least"),
    (["--preset", "chang2021-small/convbert", "--set", "conv_kernel_size=100001"],
     "conv_kernel_size 100001 is wider than the 63 taps that reach every token of a 32-token sequence"),
    (["--lr", "-1e-3"], "--lr -0.001 must be a finite number"),  # a negative value, not a missing one
    (["--layers", "-2"], "error: --layers -2 must be an integer >= 1"),  # the config's field, named by its flag
    (["--batch-size", "400000000000"], "GiB of activations for the backward pass"),
    (["--max-steps", "100000000000000"], "--max-steps 100000000000000 is above 1,000,000,000"),
]


@pytest.mark.parametrize(("extra", "needle"), IMPOSSIBLE_VALUES)
def test_impossible_values_exit_2_and_write_nothing(corpus, tmp_path, capsys, extra, needle):
    out = tmp_path / "out"
    assert main(tiny_args(corpus, out, *extra)) == 2
    one_error_line(capsys, needle)
    assert not out.exists()


@pytest.mark.parametrize("extra", [["--adam-epsilon", "nan"], ["--eval-samples", "-1"], ["--lr", "inf"]])
def test_overwrite_with_a_bad_value_leaves_the_old_run_untouched(corpus, finished_run, tmp_path, capsys, extra):
    before = snapshot(finished_run)
    assert main(tiny_args(corpus, finished_run, "--overwrite", *extra)) == 2
    one_error_line(capsys)
    assert snapshot(finished_run) == before


def test_overwrite_refuses_a_folder_holding_the_users_files(corpus, finished_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "my_analysis.md").write_text("my notes")
    (run / "notebooks").mkdir()
    (run / "notebooks" / "a.ipynb").write_text("{}")
    before = snapshot(run)
    assert main(tiny_args(corpus, run, "--overwrite")) == 2
    one_error_line(capsys, "my_analysis.md", "notebooks/", "did not write")
    assert snapshot(run) == before
    # a README the user wrote is not the model card
    (run / "my_analysis.md").unlink()
    shutil.rmtree(run / "notebooks")
    (run / "README.md").write_text("# my own notes about this convattn run\n")  # no card's metadata naming convattn
    assert main(tiny_args(corpus, run, "--overwrite")) == 2
    one_error_line(capsys, "README.md")


def test_overwrite_refuses_a_users_folder_that_happens_to_hold_an_options_file(corpus, tmp_path, capsys):
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    (mine / "pretrain_options.json").write_text("{}")
    assert main(tiny_args(corpus, mine, "--overwrite")) == 2
    one_error_line(capsys, "thesis.tex")
    assert (mine / "thesis.tex").read_text() == "years of work"


@pytest.mark.slow
def test_overwrite_replaces_a_finished_run(corpus, finished_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    assert main(tiny_args(corpus, run, "--overwrite", "--max-steps", "2", "--warmup", "1", "--eval-every", "2")) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-2"]
    assert [line for line in (run / "metrics.jsonl").read_text().splitlines()][-1].startswith('{"step": 2')
    assert not any(p.name.startswith(".replaced-run") for p in run.iterdir())  # the old run went once it stood


def test_overwrite_refuses_the_users_files_inside_the_runs_own_folders(corpus, finished_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "tensorboard" / "other-exp").mkdir()
    (run / "tensorboard" / "other-exp" / "events.out.tfevents.1.host").write_bytes(b"another experiment")
    (run / "checkpoints" / "MY_NOTES.txt").write_text("lr 1e-3 diverged at step 900")
    before = snapshot(run)
    assert main(tiny_args(corpus, run, "--overwrite")) == 2
    one_error_line(capsys, "checkpoints/MY_NOTES.txt", "tensorboard/other-exp/", "did not write")
    assert snapshot(run) == before
    # a file among the event files, a folder among the checkpoints, a file named like the Trainer's in a checkpoint
    shutil.rmtree(run / "tensorboard" / "other-exp")
    (run / "checkpoints" / "MY_NOTES.txt").unlink()
    (run / "tensorboard" / "which-run-was-which.txt").write_text("notes")
    (run / "checkpoints" / "kept-by-hand").mkdir()
    (run / "checkpoints" / "kept-by-hand" / "model.safetensors").write_bytes(b"the best one")
    last = sorted((run / "checkpoints").glob("checkpoint-*"))[-1]
    (last / "rng_state_before_my_change.pth").write_bytes(b"mine")
    before = snapshot(run)
    assert main(tiny_args(corpus, run, "--overwrite")) == 2
    one_error_line(capsys, "checkpoints/kept-by-hand/", f"checkpoints/{last.name}/rng_state_before_my_change.pth",
                   "tensorboard/which-run-was-which.txt")
    assert snapshot(run) == before


def test_a_replacement_that_diverges_gives_the_old_run_back(corpus, finished_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = snapshot(run)
    assert main(tiny_args(corpus, run, "--overwrite", "--lr", "1e30", "--warmup", "0", "--eval-every", "2")) == 2
    one_error_line(capsys, "training stopped at step")
    assert snapshot(run) == before


@pytest.mark.timing
@pytest.mark.slow
def test_a_replacement_killed_before_its_first_checkpoint_leaves_the_old_run_recoverable(corpus, finished_run,
                                                                                         tmp_path, capsys):
    import shutil
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = snapshot(run)
    never = "100000"
    argv = tiny_args(corpus, run, "--overwrite", "--max-steps", never, "--save-every", never, "--eval-every", never)
    process = subprocess.Popen([sys.executable, "-m", "convattn", *argv], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        give_up = time.monotonic() + 600  # only against a hang; nothing is asserted about time
        while not ((run / ".replaced-run").is_dir() and (run / "pretrain_options.json").is_file()):
            assert process.poll() is None and time.monotonic() < give_up
            time.sleep(0.05)
    finally:
        process.kill()  # kill -9: no clean-up runs
        process.wait()
    assert (run / ".replaced-run").is_dir()  # the old run, aside, beside the new run's first files
    assert main(["pretrain", "--output-dir", str(run), "--resume"]) == 0
    out = capsys.readouterr()
    assert "the earlier run is back as it was" in out.err and "already finished" in out.out
    assert snapshot(run) == before


def test_a_busy_folder_is_refused(corpus, tmp_path, capsys):
    out = tmp_path / "busy"
    with run_folder_lock(out):  # another run holds it
        assert main(tiny_args(corpus, out)) == 2
        one_error_line(capsys, "in use by another convattn run", f"pid {os.getpid()}")
        assert [p.name for p in out.iterdir()] == [LOCK_FILE]
    assert not out.exists()  # the holder wrote nothing: no trace left


def test_diverging_training_stops_with_one_line_and_saves_no_model(corpus, tmp_path, capsys):
    out = tmp_path / "diverged"
    assert main(tiny_args(corpus, out, "--lr", "1e30", "--warmup", "0")) == 2
    err = one_error_line(capsys, "training stopped at step", "--lr")
    assert "nan" in err or "inf" in err or "non-finite" in err
    assert not (out / "model.safetensors").exists()


@pytest.mark.slow
def test_interrupted_before_the_first_checkpoint_leaves_nothing_in_the_way(corpus, tmp_path):
    from convattn.cli import build_parser
    from convattn.commands.pretrain import options_from_args
    from convattn.training.pretrain import pretrain

    out = tmp_path / "early"
    options = options_from_args(build_parser().parse_args(tiny_args(corpus, out, "--save-every", "4")))
    summary = pretrain(options, callbacks=[InterruptAt(1)])
    text = "\n".join(summary.lines())
    assert summary.interrupted and summary.checkpoint is None
    assert "--resume" not in text and "outputs" not in text and "run the same command again" in text
    assert not out.exists()
    short = ["--max-steps", "2", "--warmup", "1", "--eval-every", "2", "--save-every", "2"]
    assert main(tiny_args(corpus, out, *short)) == 0


@pytest.mark.slow
def test_an_unstarted_run_is_restarted_and_resume_says_why_not(corpus, tmp_path, capsys):
    out = tmp_path / "unstarted"
    out.mkdir()
    (out / "metrics.jsonl").write_text("")
    (out / "pretrain_options.json").write_text("{}")
    assert main(tiny_args(corpus, out, "--resume")) == 2
    one_error_line(capsys, "pretrain_options.json is damaged or not written by convattn")
    from convattn.cli import build_parser
    from convattn.commands.pretrain import options_from_args

    options = options_from_args(build_parser().parse_args(tiny_args(corpus, out)))
    (out / "pretrain_options.json").write_text(json.dumps(options.to_json()))
    assert main(tiny_args(corpus, out, "--resume")) == 2
    one_error_line(capsys, "stopped before its first checkpoint", "without --resume")
    assert main(tiny_args(corpus, out, "--max-steps", "2", "--warmup", "1", "--eval-every", "2")) == 0
    assert (out / "model.safetensors").is_file()


def test_a_finished_run_resumed_changes_nothing(finished_run, capsys):
    before = snapshot(finished_run)
    assert main(["pretrain", "--output-dir", str(finished_run), "--resume"]) == 0
    assert "already finished" in capsys.readouterr().out
    assert snapshot(finished_run) == before
    assert main(["pretrain", "--output-dir", str(finished_run), "--resume", "--max-steps", "3",
                 "--allow-schedule-change"]) == 2
    one_error_line(capsys, "--max-steps 3 is below step 4")
    assert snapshot(finished_run) == before


def test_a_dangling_symlink_as_output_dir_is_one_line(corpus, tmp_path, capsys):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    assert main(tiny_args(corpus, link)) == 2
    one_error_line(capsys, "does not exist")


@pytest.mark.parametrize(("code", "needles"), [
    (errno.ENOSPC, ("No space left on device", "/x/model", "free some space")),
    (errno.EROFS, ("Read-only file system", "choose a writable")),
    (errno.EACCES, ("Permission denied", "permissions")),
])
def test_a_failing_machine_is_one_line_not_an_unexpected_error(monkeypatch, capsys, code, needles):
    import convattn.commands.pretrain as command

    def fails(args):
        raise RuntimeError("failed to save") from OSError(code, os.strerror(code), "/x/model")

    monkeypatch.setattr(command, "add_arguments", lambda parser: parser.set_defaults(func=fails))
    assert main(["pretrain"]) == 2
    one_error_line(capsys, *needles)


def test_a_path_component_too_long_for_the_filesystem_is_one_line(corpus, tmp_path, capsys):
    assert main(tiny_args(corpus, tmp_path / ("a" * 300))) == 2
    one_error_line(capsys, "File name too long", "choose a shorter path")


def test_files_are_readable_by_others_and_the_tokenizer_states_the_models_length(finished_run):
    from transformers import AutoTokenizer

    for name in ("README.md", "metrics.jsonl", "pretrain_options.json", "convattn_model.py", "perplexity.png",
                 "model.safetensors"):
        assert (finished_run / name).stat().st_mode & 0o777 == 0o666 & ~current_umask(), name
    tokenizer = AutoTokenizer.from_pretrained(finished_run)  # relative positions: any length
    assert tokenizer.model_max_length > 10**9


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_push_without_network_is_one_line_and_leaves_the_card_alone(finished_run, monkeypatch, capsys):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import OfflineModeIsEnabled

    def offline(self, *args, **kwargs):
        raise OfflineModeIsEnabled("offline")

    before = snapshot(finished_run)
    monkeypatch.setattr(HfApi, "upload_folder", offline)
    monkeypatch.setattr(HfApi, "create_repo", lambda self, *args, **kwargs: None)
    assert main(["push", str(finished_run), "--repo", "someone/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("convattn push: error: cannot reach the Hugging Face Hub") and len(err.splitlines()) == 1
    assert {k: v[0] for k, v in snapshot(finished_run).items()} == {k: v[0] for k, v in before.items()}


@pytest.mark.slow
def test_bf16_autocast_trains_on_cpu(corpus, tmp_path):
    out = tmp_path / "bf16"
    assert main(tiny_args(corpus, out, "--precision", "bf16", "--max-steps", "4", "--eval-every", "2")) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(row["perplexity"]) for row in rows) and rows[-1]["perplexity"] < rows[0]["perplexity"]


@pytest.mark.slow
def test_resume_reads_the_text_the_run_started_with(corpus, tmp_path, monkeypatch, capsys):
    import shutil

    from convattn.cli import build_parser
    from convattn.commands.pretrain import options_from_args
    from convattn.training.pretrain import pretrain

    here, elsewhere, out = tmp_path / "here", tmp_path / "elsewhere", tmp_path / "run"
    shutil.copytree(corpus, here)
    elsewhere.mkdir()
    (elsewhere / "train.txt").write_text("another text entirely\n" * 300)
    (elsewhere / "valid.txt").write_text("another text entirely\n" * 30)
    monkeypatch.chdir(here)
    relative = [arg.replace(str(corpus) + "/", "") for arg in tiny_args(corpus, out)]  # train.txt, valid.txt
    pretrain(options_from_args(build_parser().parse_args(relative)), callbacks=[InterruptAt(3)])  # checkpoint-2
    assert json.loads((out / "pretrain_options.json").read_text())["train_files"] == [str(here / "train.txt")]

    monkeypatch.chdir(elsewhere)  # its own train.txt and valid.txt: not the run's
    assert main(["pretrain", "--output-dir", str(out), "--resume"]) == 0
    assert str(elsewhere) not in capsys.readouterr().err

    (here / "train.txt").write_text((here / "train.txt").read_text() + "one more line\n")
    (out / "model.safetensors").unlink()  # the last checkpoint is the end: only the final save is done again
    before = snapshot(out)
    assert main(["pretrain", "--output-dir", str(out), "--resume"]) == 2
    one_error_line(capsys, "--resume: the text read now", "is not the text the run in", "started with")
    assert snapshot(out) == before


@pytest.mark.slow
def test_a_non_finite_eval_loss_stops_the_run_before_that_steps_checkpoint(corpus, tmp_path, monkeypatch, capsys):
    import torch

    from convattn.training.pretrain.trainer import PretrainTrainer

    eval_sums = PretrainTrainer._eval_sums

    def nan_from_step_4(self, model, batch):  # finite but huge weights: a finite training loss, a NaN eval loss
        sums = eval_sums(self, model, batch)
        return {**sums, "loss": sums["loss"] * torch.nan} if self.state.global_step >= 4 else sums

    monkeypatch.setattr(PretrainTrainer, "_eval_sums", nan_from_step_4)
    out = tmp_path / "run"
    assert main(tiny_args(corpus, out)) == 2  # evaluations at steps 0, 4, 8; checkpoints every 2 steps
    one_error_line(capsys, "training stopped at step 4: the eval loss is nan", "--lr")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["checkpoint-2"]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [0]
    assert not (out / "model.safetensors").exists()


@pytest.fixture(scope="module")
def stopped_run(corpus, tmp_path_factory):
    """A run stopped at step 5: checkpoints 2 and 4."""
    from convattn.cli import build_parser
    from convattn.commands.pretrain import options_from_args
    from convattn.training.pretrain import pretrain

    out = tmp_path_factory.mktemp("runs") / "stopped"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("CONVATTN_CACHE", str(tmp_path_factory.getbasetemp() / "convattn-cache"))
        pretrain(options_from_args(build_parser().parse_args(tiny_args(corpus, out))), callbacks=[InterruptAt(5)])
    return out


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


@pytest.mark.parametrize(("damage", "said"), [
    (lambda c: (c / "optimizer.pt").unlink(), "optimizer.pt is missing"),
    (lambda c: truncate(c / "optimizer.pt"), "optimizer.pt is truncated or corrupt"),
    (lambda c: truncate(c / "scheduler.pt"), "scheduler.pt is truncated or corrupt"),
    (lambda c: truncate(c / "rng_state.pth"), "rng_state.pth is truncated or corrupt"),
    (lambda c: (c / "model.safetensors").unlink(), "model.safetensors is missing"),
    (lambda c: truncate(c / "model.safetensors"), "model.safetensors is truncated or corrupt"),
    (lambda c: (c / "trainer_state.json").write_text("{}"), "trainer_state.json is not a trainer state"),
    (lambda c: (c / "trainer_state.json").write_text("[]"), "trainer_state.json is not a trainer state"),
    (lambda c: (c / "trainer_state.json").write_text('{"global_step": 3}'),
     "its trainer_state.json is at step 3, not 4: a copied or renamed folder"),
])
@pytest.mark.slow
def test_resume_refuses_a_damaged_checkpoint_and_offers_the_one_before(stopped_run, tmp_path, capsys, damage, said):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    damage(run / "checkpoints" / "checkpoint-4")
    before = snapshot(run)
    assert main(["pretrain", "--output-dir", str(run), "--resume"]) == 2
    one_error_line(capsys, f"checkpoint-4 is damaged ({said}); delete that folder to resume from checkpoint-2")
    assert snapshot(run) == before
    damage(run / "checkpoints" / "checkpoint-2")
    assert main(["pretrain", "--output-dir", str(run), "--resume"]) == 2
    one_error_line(capsys, f"checkpoint-4 is damaged ({said}); start the run again with --overwrite")


def test_a_finished_runs_damaged_final_model_is_named_and_saved_again(finished_run, tmp_path, capsys):
    import shutil

    from convattn.files import check_weight_file

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    truncate(run / "model.safetensors")
    assert main(["pretrain", "--output-dir", str(run), "--resume"]) == 0
    printed = capsys.readouterr()
    assert "model.safetensors is truncated or corrupt: saving the final model again from" in printed.err
    assert "already finished" not in printed.out
    check_weight_file(run / "model.safetensors")
    assert (run / "model.safetensors").read_bytes() == (finished_run / "model.safetensors").read_bytes()


@pytest.mark.parametrize(("damage", "said"), [
    (lambda run: (run / "pretrain_options.json").write_text("[]"),
     "pretrain_options.json is damaged or not written by convattn (a JSON list, not the run's options)"),
    (lambda run: (run / "pretrain_options.json").unlink(),
     "has checkpoints but no pretrain_options.json (the options it was started with)"),
    (lambda run: (run / "metrics.jsonl").write_text('{"step": 2}\n{oops\n'),
     "metrics.jsonl:2: not a metrics row (a JSON object per line)"),
    (lambda run: shutil.copytree(run / "checkpoints" / "checkpoint-4", run / "checkpoints" / "checkpoint-99"),
     "checkpoint-99 is damaged (its trainer_state.json is at step 4, not 99: a copied or renamed folder); delete that "
     "folder to resume from checkpoint-4"),
])
def test_resume_of_a_damaged_run_names_the_file_and_changes_nothing(stopped_run, corpus, tmp_path, capsys, damage,
                                                                    said):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    damage(run)
    before = snapshot(run)
    assert main(tiny_args(corpus, run, "--resume")) == 2
    one_error_line(capsys, said)
    assert snapshot(run) == before


def test_corpus_inputs_that_are_not_text_are_named(corpus, tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "utf16.txt").write_text("hello world\n" * 50, encoding="utf-16")
    cases = [
        (["--eval-file", str(fifo)], "not a regular file (a FIFO, socket or device)"),
        (["--train-file", str(tmp_path / "utf16.txt")], "UTF-16 text, not UTF-8; convert it, e.g. iconv -f UTF-16"),
    ]
    for extra, needle in cases:
        out = tmp_path / "out"
        assert main(tiny_args(corpus, out, *extra)) == 2
        one_error_line(capsys, needle)
        assert not out.exists()


def test_a_run_folder_and_a_corpus_folder_stay_apart(corpus, finished_run, tmp_path, capsys):
    texts = tmp_path / "texts"
    texts.mkdir()
    shutil.copy(corpus / "train.txt", texts)
    args = [a for a in tiny_args(corpus, tmp_path / "out") if a not in ("--train-file", str(corpus / "train.txt"))]
    out = texts / "run"
    assert main([*args[:-1], str(out), "--train-file", str(texts)]) == 2
    one_error_line(capsys, f"--output-dir {out} is inside --train-file {texts}", "outside the corpus folder")
    assert not out.exists()
    shutil.copytree(finished_run, texts / "old-run")  # a run someone left in the corpus folder
    assert main([*args, "--train-file", str(texts)]) == 2
    one_error_line(capsys, f"{texts / 'old-run'} is a convattn run or model folder (it holds pretrain_options.json)")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_overwrite_takes_the_figures_plot_drew_into_the_run_but_not_the_users_files_beside_them(
        corpus, finished_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "plots").mkdir()  # `convattn plot kernels RUN` draws into RUN/plots by default
    (run / "plots" / "fixed_kernels.png").write_bytes(b"\x89PNG figure")
    (run / "plots" / "log.txt").write_text("plot's log")
    (run / "plots" / "my_figure.svg").write_text("mine")
    before = snapshot(run)
    assert main(tiny_args(corpus, run, "--overwrite")) == 2
    one_error_line(capsys, "plots/my_figure.svg", "did not write")
    assert snapshot(run) == before
    (run / "plots" / "my_figure.svg").unlink()
    assert main(tiny_args(corpus, run, "--overwrite", "--max-steps", "2", "--warmup", "1", "--eval-every", "2")) == 0
    assert not (run / "plots").exists()  # the old model's figures went with it


@pytest.mark.slow
def test_overwrite_takes_what_a_comparison_made_of_the_run_but_not_the_users_files_beside_it(
        corpus, finished_run, tmp_path, capsys):
    """A comparison's seed folder holds the run's scores at each length and its --glue / --squad folders: they
    were refused as files convattn did not write; they score the old model, so they go with it."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "length_eval.json").write_text('{"lengths": [128], "files": ["valid.txt"], "results": []}')
    seed = run / "glue" / "runs" / "sst2" / "seed0"
    (seed / "predictions").mkdir(parents=True)
    (seed / "run.json").write_text("{}")
    (seed / "predictions" / "SST-2.tsv").write_text("index\tprediction\n")
    (run / "glue" / "glue_results.json").write_text("{}")
    (run / "squad" / "runs" / "squad1.1" / "seed0").mkdir(parents=True)
    (run / "squad" / "runs" / "squad1.1" / "seed0" / "run.json").write_text("{}")
    (run / "glue" / "runs" / "sst2" / "my_analysis.ipynb").write_text("mine")
    before = snapshot(run)
    assert main(tiny_args(corpus, run, "--overwrite")) == 2
    line = one_error_line(capsys, "glue/runs/sst2/my_analysis.ipynb", "did not write")
    assert "length_eval.json" not in line and "SST-2.tsv" not in line and "squad" not in line
    assert snapshot(run) == before
    (run / "glue" / "runs" / "sst2" / "my_analysis.ipynb").unlink()
    assert main(tiny_args(corpus, run, "--overwrite", "--max-steps", "2", "--warmup", "1", "--eval-every", "2")) == 0
    assert not any((run / name).exists() for name in ("length_eval.json", "glue", "squad"))
