"""`convattn pretrain` end to end on a tiny config: outputs, exact resume, bad input, ELECTRA."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from helpers.pretrain import TINY, WORDS, InterruptAt, main_offline, tiny_args, write_corpus
from safetensors.torch import load_file
from transformers import (
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
)

from convattn.cli import main
from convattn.commands.pretrain import options_from_args
from convattn.runs.environment import recorded_environments
from convattn.runs.pretrain import complete_checkpoints
from convattn.training import length_eval
from convattn.training.pretrain import pretrain
from convattn.training.pretrain.callbacks import elapsed_at


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def weights(directory) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def assert_same_run(out, expected) -> None:
    """The run in `out` trained what the run in `expected` did: every weight bit for bit, every eval loss."""
    ours, theirs = weights(out), weights(expected)
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert torch.equal(theirs[name], ours[name]), name
    assert eval_losses(out) == eval_losses(expected)


def eval_losses(run) -> list[float]:
    """The eval loss of each row of the run's metrics.jsonl."""
    return [json.loads(line)["eval_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "full"
    assert main_offline(tiny_args(corpus, out), tmp_path_factory) == 0
    return out


def test_outputs_load_with_auto_classes(finished_run):
    import convattn  # noqa: F401  (registers the Auto classes)

    model = AutoModelForMaskedLM.from_pretrained(finished_run)
    tokenizer = AutoTokenizer.from_pretrained(finished_run)
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == len(tokenizer)
    assert model.config.mask_token_id == tokenizer.mask_token_id
    batch = tokenizer(["the city of the king"], return_tensors="pt")
    assert model(**batch).logits.shape[-1] == len(tokenizer)
    assert (finished_run / "perplexity.png").stat().st_size > 0
    assert any((finished_run / "tensorboard").iterdir())
    # the model folder carries its modeling code; a checkpoint, which convattn resumes, none (issue 66)
    assert (finished_run / "convattn_model.py").is_file()
    for checkpoint in (finished_run / "checkpoints").iterdir():
        assert not list(checkpoint.glob("*.py")), checkpoint
        assert "auto_map" not in json.loads((checkpoint / "config.json").read_text()), checkpoint
        assert AutoModelForMaskedLM.from_pretrained(checkpoint).config.num_hidden_layers == 2  # convattn loads it


def test_metrics_rows_have_exact_perplexity(finished_run):
    rows = [json.loads(line) for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 4, 8]
    for row in rows:
        assert row["perplexity"] == pytest.approx(math.exp(row["eval_loss"]), rel=1e-4)
    for row in rows[1:]:
        assert row["train_loss"] > 0 and row["tokens_per_second"] > 0 and row["learning_rate"] >= 0
    assert rows[-1]["perplexity"] < rows[0]["perplexity"]


@pytest.mark.slow
def test_interrupted_then_resumed_run_matches_uninterrupted(corpus, finished_run, tmp_path):
    from convattn.cli import build_parser
    from convattn.denormals import flush_denormals

    out = tmp_path / "interrupted"
    options = options_from_args(build_parser().parse_args(tiny_args(corpus, out)))
    flush_denormals()  # as the command line starts a run, so that its resume below moves no setting
    summary = pretrain(options, callbacks=[InterruptAt(5)])  # after checkpoint-4, before checkpoint-6
    assert summary.interrupted and not (out / "model.safetensors").exists()
    assert [p.name for p in complete_checkpoints(out / "checkpoints")] == ["checkpoint-2", "checkpoint-4"]
    # each checkpoint keeps the run's time at its save, after that step's evaluation: the resume goes on from it
    row = next(r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["step"] == 4)
    assert elapsed_at(out / "checkpoints" / "checkpoint-4") >= row["elapsed_seconds"] - 0.05
    assert main(tiny_args(corpus, out, "--resume")) == 0
    assert_same_run(out, finished_run)
    # the tied decoder is saved under the embeddings' name: no "missing keys" in the run's log on resuming
    log = (out / "log.txt").read_text()
    assert "Resuming training from checkpoint" in log and "missing keys" not in log
    # each start recorded what it trained on; the card says it once (nothing moved)
    assert [e["step"] for e in recorded_environments(out)] == [0, 4]
    card = (out / "README.md").read_text()
    assert "- trained on: cpu (" in card and "(resumed)" not in card


def test_resume_rejects_changed_options_naming_the_option_and_its_fix(corpus, finished_run, capsys):
    """The hint is the one for the option that changed: --allow-schedule-change only for a schedule change (issue
    66: a changed --lr got the hint for changing --max-steps)."""
    assert main(tiny_args(corpus, finished_run, "--resume", "--lr", "0.5")) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--lr: 0.0003 -> 0.5" in line and "drop --lr" in line, line
    assert "--allow-schedule-change" not in line and "--max-steps" not in line, line
    assert main(tiny_args(corpus, finished_run, "--resume", "--lr", "0.5", "--max-steps", "12")) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "drop --lr, --max-steps (" in line and "drop --lr and add --allow-schedule-change to change --max-steps" \
        in line, line


def test_no_decay_on_biases_and_layernorm():
    from convattn import ConvAttnConfig, ConvAttnForMaskedLM

    model = ConvAttnForMaskedLM(ConvAttnConfig.from_preset("chang2021-small/composite", num_hidden_layers=1))
    decayed = set(Trainer.get_decay_parameter_names(None, model))
    for name, _ in model.named_parameters():
        assert (name in decayed) == (not name.endswith("bias") and "LayerNorm" not in name), name


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--vocab-size", "4"], "--vocab-size 4"),
        (["--seq-len", "512"], "--seq-len 512 is above the model's maximum of 128"),
        (["--preset", "chang2021-small/nope"], "unknown preset"),
        (["--recipe", "nope"], "unknown recipe"),
        (["--set", "hiden_size=3"], "did you mean hidden_size"),
        (["--set", "hidden_dropout_prob=abc"], "--set hidden_dropout_prob='abc': expected float"),
        (["--batch-size", "7", "--gradient-accumulation", "2"], "--batch-size 7"),
    ],
)
def test_bad_options_exit_2_and_write_nothing(corpus, tmp_path, capsys, extra, needle):
    out = tmp_path / "out"
    assert main(tiny_args(corpus, out, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and err.startswith("convattn pretrain: error:")
    assert not out.exists()


@pytest.mark.parametrize("content", [b"", b"caf\xe9 au lait\n"])
def test_bad_corpus_files_exit_2_and_write_nothing(corpus, tmp_path, capsys, content):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    out = tmp_path / "out"
    args = ["pretrain", *TINY, "--train-file", str(bad), "--output-dir", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and not out.exists()
    assert main([*args[:-4], "--train-file", str(tmp_path / "missing.txt"), "--output-dir", str(out)]) == 2
    assert not out.exists()


def test_existing_output_dir_needs_resume_or_overwrite(corpus, finished_run, capsys):
    assert main(tiny_args(corpus, finished_run)) == 2
    assert "--resume" in capsys.readouterr().err


def test_help_reads_like_a_cli(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["pretrain", "--help"])
    text = capsys.readouterr().out
    assert exit_.value.code == 0
    for part in ("model:", "data:", "training:", "output:", "examples:", "--resume", "[default recipe: 500]"):
        assert part in text


@pytest.mark.slow
def test_electra_objective_saves_a_discriminator_to_fine_tune(corpus, tmp_path):
    out = tmp_path / "electra"
    # the composite preset has no absolute positions: the shared embeddings must still tie
    assert main(tiny_args(corpus, out, "--objective", "electra", "--max-steps", "4")) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["discriminator_accuracy"] > 0 and (out / "config.json").exists()
    classifier = AutoModelForSequenceClassification.from_pretrained(out / "discriminator", num_labels=2)
    pretraining = weights(out)
    for name, value in classifier.convattn.state_dict().items():
        torch.testing.assert_close(value, pretraining[f"convattn.{name}"], rtol=0, atol=0)
    assert AutoTokenizer.from_pretrained(out / "discriminator").mask_token == "[MASK]"

    # the length evaluation scores its generator, the masked LM it holds (before: the discriminator under a
    # masked-LM head drawn at random), here against the generator in float64 on the same blocks and masks
    from convattn.electra import ConvAttnForPreTraining

    tokenizer = AutoTokenizer.from_pretrained(out)
    row, = length_eval.evaluate_at_lengths(out, [corpus / "valid.txt"], [16], max_blocks=6, seed=3)
    stream = length_eval.token_stream(tokenizer, (corpus / "valid.txt").read_text().splitlines())[:6 * 14]
    hidden = torch.rand(len(stream), generator=torch.Generator().manual_seed(3)) < length_eval.MASK_PROBABILITY
    reference = ConvAttnForPreTraining.from_pretrained(out).double().eval()
    expected = length_eval.perplexity_at(reference.generator, reference.generator_head, tokenizer.mask_token_id,
                                         length_eval.blocks_of(stream, 16, tokenizer.cls_token_id,
                                                               tokenizer.sep_token_id),
                                         length_eval.blocks_of(hidden, 16, False, False), batch_size=1)
    assert (row.perplexity, row.masked_tokens) == (pytest.approx(expected[0], rel=1e-5), expected[1])
    with pytest.raises(ValueError, match="discriminator holds no masked-LM head"):  # an encoder alone
        length_eval.evaluate_at_lengths(out / "discriminator", [corpus / "valid.txt"], [16])


@pytest.mark.slow
def test_a_small_train_file_without_eval_file_trains(tmp_path):
    rng = random.Random(1)
    small = tmp_path / "small.txt"  # 150 lines: the held-out split is 1 line, a batch of one for `pairs`
    small.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(150)) + "\n")
    out = tmp_path / "out"
    args = ["pretrain", *TINY, "--train-file", str(small), "--output-dir", str(out), "--max-steps", "3",
            "--eval-every", "3"]
    assert main(args) == 0
    assert (out / "model.safetensors").is_file()


def test_eval_on_training_text_is_allowed_only_by_name_and_then_said_in_the_record_and_summary(corpus, tmp_path,
                                                                                               capsys):
    out = tmp_path / "out"
    args = tiny_args(corpus, out, "--max-steps", "2", "--eval-every", "2", "--warmup", "1", "--eval-samples", "8",
                     "--allow-eval-overlap")
    args[args.index(str(corpus / "valid.txt"))] = str(corpus / "train.txt")
    assert main(args) == 0
    captured = capsys.readouterr()
    said = f"eval text is training text ({corpus / 'train.txt'} is the same file as {corpus / 'train.txt'})"
    assert json.loads((out / "pretrain_data.json").read_text())["eval_overlap"] == said
    assert json.loads((out / "pretrain_options.json").read_text())["allow_eval_overlap"] is True
    assert f"eval: {said}, as --allow-eval-overlap allows" in captured.err
    [line] = [line for line in captured.out.splitlines() if line.startswith("  eval perplexity")]
    assert line.endswith(f"({said})")


@pytest.mark.slow
def test_resume_reads_the_runs_own_options_and_guards_its_schedule(finished_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    assert main(["pretrain", "--output-dir", str(run), "--resume"]) == 0  # nothing repeated
    capsys.readouterr()
    assert main(["pretrain", "--output-dir", str(run), "--resume", "--max-steps", "12"]) == 2
    err = capsys.readouterr().err
    assert "--max-steps: 8 -> 12" in err and "--allow-schedule-change" in err and len(err.strip().splitlines()) == 1
    assert main(["pretrain", "--output-dir", str(run), "--resume", "--max-steps", "12",
                 "--allow-schedule-change"]) == 0
    assert complete_checkpoints(run / "checkpoints")[-1].name == "checkpoint-12"


def test_saved_run_has_a_model_card_and_works_in_a_fill_mask_pipeline(finished_run):
    import yaml
    from transformers import pipeline

    import convattn  # noqa: F401  (registers the Auto classes)

    card = (finished_run / "README.md").read_text()
    metadata = yaml.safe_load(card.split("---")[1])
    assert metadata["library_name"] == "transformers" and metadata["pipeline_tag"] == "fill-mask"
    assert "chang2021-small/composite" in metadata["tags"]
    last = json.loads((finished_run / "metrics.jsonl").read_text().splitlines()[-1])
    assert metadata["model-index"][0]["results"][0]["metrics"][0]["value"] == last["perplexity"]
    assert f"- steps: {last['step']}" in card and "train.txt" in card
    fill = pipeline("fill-mask", model=str(finished_run), device="cpu")
    predictions = fill(f"the city of the {fill.tokenizer.mask_token}", top_k=3)
    assert len(predictions) == 3 and all(p["token_str"] for p in predictions)
    assert all("  " not in p["sequence"] for p in predictions)  # [MASK] took the space before it


def test_push_writes_the_card_and_uploads_the_folder_without_local_state(finished_run, monkeypatch):
    from huggingface_hub import HfApi

    calls = {}
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: calls.setdefault("create", (repo_id, kw)))
    monkeypatch.setattr(HfApi, "upload_folder", lambda self, **kw: calls.setdefault("upload", kw) and "url")
    assert main(["push", str(finished_run), "--repo", "someone/tiny-composite", "--private"]) == 0
    assert calls["create"] == ("someone/tiny-composite", {"private": True, "exist_ok": True, "repo_type": "model"})
    upload = calls["upload"]
    assert upload["folder_path"] == str(finished_run) and upload["repo_id"] == "someone/tiny-composite"
    assert "checkpoints/*" in upload["ignore_patterns"] and "tensorboard/*" in upload["ignore_patterns"]
    assert "someone/tiny-composite" in (finished_run / "README.md").read_text()
    assert main(["push", str(finished_run / "checkpoints"), "--repo", "someone/x"]) == 2


def test_perplexity_at_lengths_extends_relative_models_and_reports_absolute_ones(finished_run, corpus, tmp_path):
    import shutil

    from convattn.training.length_eval import evaluate_at_lengths

    lengths = [32, 64, 128]
    relative = evaluate_at_lengths(finished_run, [corpus / "valid.txt"], lengths, max_blocks=4)
    assert [r.length for r in relative] == lengths
    assert all(r.perplexity is not None and math.isfinite(r.perplexity) and r.masked_tokens > 0 for r in relative)
    # the same run with absolute positions (trained max 32) cannot go past 32
    absolute = tmp_path / "absolute"
    shutil.copytree(finished_run, absolute, ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    config = json.loads((absolute / "config.json").read_text())
    config.update(position_embedding_type="absolute", max_position_embeddings=32)
    (absolute / "config.json").write_text(json.dumps(config))
    rows = evaluate_at_lengths(absolute, [corpus / "valid.txt"], lengths, max_blocks=4)
    assert rows[0].perplexity is not None
    assert [r.note for r in rows[1:]] == ["cannot extend: absolute position embeddings stop at 32"] * 2


def test_a_length_whose_blocks_have_no_masked_token_has_no_perplexity(finished_run, corpus):
    """At length 3 a block holds one token, masked at 15 %: one block at seed 0 masks none, and a perplexity of
    exp(0) = 1 (a perfect model) was reported for it."""
    from convattn.training.length_eval import evaluate_at_lengths

    row, = evaluate_at_lengths(finished_run, [corpus / "valid.txt"], [3], max_blocks=1, seed=0)
    assert (row.perplexity, row.masked_tokens, row.blocks) == (None, 0, 1)
    assert row.note == "no token masked in 1 block(s) of 3 tokens: give more eval text"


def test_perplexity_at_lengths_against_float64_on_the_eval_texts_blocks(finished_run, corpus, monkeypatch):
    """`evaluate_at_lengths` recomputed from its definition: the texts' lines (a whitespace-only one is no text)
    tokenized without special tokens into one stream, cut from its start into [CLS] + (n - 2) tokens + [SEP]
    blocks, [MASK] over the stream's tokens one generator seeded with seed draws at MASK_PROBABILITY, the same
    tokens hidden at every length (the model is given exactly these inputs), perplexity = exp(the masked tokens'
    summed loss / their count) in float64. Lengths from one token a block to the whole stream in one block, and
    one block longer than the text."""
    import torch.nn.functional as F

    from convattn.model import ConvAttnForMaskedLM
    from convattn.training.length_eval import MASK_PROBABILITY, evaluate_at_lengths

    tokenizer = AutoTokenizer.from_pretrained(finished_run)
    reference = ConvAttnForMaskedLM.from_pretrained(finished_run).double().eval()
    model = ConvAttnForMaskedLM.from_pretrained(finished_run).eval()
    given = []
    model.convattn.register_forward_pre_hook(lambda _, args, kwargs: given.append(kwargs["input_ids"]),
                                             with_kwargs=True)
    monkeypatch.setattr(length_eval, "masked_lm", lambda *args: (model.convattn, model.mlm_head, model.config))
    lines = (corpus / "valid.txt").read_text().splitlines()[:4]
    texts = [lines[0], "   ", lines[1], "", lines[2], " ", lines[3]]
    stream = [i for line in lines for i in tokenizer(line, add_special_tokens=False)["input_ids"]]
    cls, sep, mask = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id
    assert not {cls, sep, mask} & set(stream)
    lengths = [3, 10, len(stream) + 2, len(stream) + 3]
    rows = evaluate_at_lengths(finished_run, texts, lengths, max_blocks=None, seed=5, batch_size=3)
    assert [row.length for row in rows] == lengths
    hidden = torch.rand(len(stream), generator=torch.Generator().manual_seed(5)) < MASK_PROBABILITY
    for n, row in zip(lengths[:-1], rows, strict=False):
        body, blocks = n - 2, len(stream) // (n - 2)
        chosen = [[False, *hidden[b * body:(b + 1) * body].tolist(), False] for b in range(blocks)]
        expected, total, masked = [], 0.0, 0
        with torch.no_grad():
            for b in range(blocks):
                ids = [cls, *stream[b * body:(b + 1) * body], sep]
                scored = [t for t in range(1, n - 1) if chosen[b][t]]
                expected.append([mask if t in scored else token for t, token in enumerate(ids)])
                logits = reference(input_ids=torch.tensor(expected[-1:])).logits[0]
                targets = torch.tensor([ids[t] for t in scored], dtype=torch.long)
                total += F.cross_entropy(logits[scored], targets, reduction="sum").item()
                masked += len(scored)
        assert torch.equal(torch.cat([ids for ids in given if ids.shape[1] == n]), torch.tensor(expected))
        assert (row.blocks, row.masked_tokens, row.note) == (blocks, masked, "") and masked > 0
        assert row.perplexity == pytest.approx(math.exp(total / masked), rel=1e-5)
    assert rows[2].blocks == 1
    assert (rows[-1].perplexity, rows[-1].masked_tokens, rows[-1].blocks) == (None, 0, 0)
    assert rows[-1].note == f"eval text too short for one block of {lengths[-1]} tokens"


def test_every_length_scores_the_same_tokens_under_a_cap_on_the_blocks(finished_run, corpus, monkeypatch):
    """max_blocks caps the blocks of the longest length; every shorter one scores the same first tokens in more
    blocks, with the same of them masked. Capping each length's blocks scored the first 2 x 8 tokens at n = 10 and
    2 x 32 at n = 34: text's difficulty read as a length's effect (and a mask drawn per length, its draw's)."""
    from convattn.model import ConvAttnForMaskedLM
    from convattn.training.length_eval import evaluate_at_lengths

    tokenizer = AutoTokenizer.from_pretrained(finished_run)
    model = ConvAttnForMaskedLM.from_pretrained(finished_run).eval()
    given = []
    model.convattn.register_forward_pre_hook(lambda _, args, kwargs: given.append(kwargs["input_ids"]),
                                             with_kwargs=True)
    monkeypatch.setattr(length_eval, "masked_lm", lambda *args: (model.convattn, model.mlm_head, model.config))
    lines = (corpus / "valid.txt").read_text().splitlines()
    stream = [i for line in lines for i in tokenizer(line, add_special_tokens=False)["input_ids"]]
    assert len(stream) > 3 * 64  # the cap, not the text, bounds what is scored
    rows = evaluate_at_lengths(finished_run, lines, [10, 34, 6], max_blocks=2, batch_size=4)
    assert [(row.length, row.blocks) for row in rows] == [(10, 8), (34, 2), (6, 16)]
    for n in (10, 34, 6):
        bodies = torch.cat([ids for ids in given if ids.shape[1] == n])[:, 1:-1]
        assert bodies.shape[0] * bodies.shape[1] == 64
        unmasked = bodies.flatten() != tokenizer.mask_token_id
        assert torch.equal(bodies.flatten()[unmasked], torch.tensor(stream[:64])[unmasked])
        if n == 10:
            hidden = ~unmasked
        assert torch.equal(~unmasked, hidden)  # and the same tokens hidden: lengths differ by context alone
    assert 0 < int(hidden.sum()) < 64


def word_tokenizer():
    """A word-level tokenizer of WORDS with BERT's special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def test_training_masks_follow_the_seed_and_the_tokens_at_the_recipes_rate():
    """A training batch's masks come from the seed and its tokens alone: the same batch is masked the same way
    whatever the global generator did (a resumed run repeats the uninterrupted one's), another batch of the same
    shape or another seed otherwise; 15 % of the maskable tokens, 80 % of those [MASK] (BERT's), each within four
    standard deviations over 24,000 tokens."""
    from convattn.training.pretrain.data import MaskingCollator

    tokenizer = word_tokenizer()
    rng = random.Random(0)

    def batch():
        return [tokenizer(" ".join(rng.choices(WORDS, k=60))) for _ in range(400)]

    first, second = batch(), batch()
    collate = MaskingCollator(tokenizer, 0.15, seed=0)
    masked = collate(first)
    torch.manual_seed(123)
    again = collate(first)
    assert torch.equal(again["input_ids"], masked["input_ids"]) and torch.equal(again["labels"], masked["labels"])
    chosen = masked["labels"] != -100
    assert not torch.equal(collate(second)["labels"] != -100, chosen)
    assert not torch.equal(MaskingCollator(tokenizer, 0.15, seed=1)(first)["labels"] != -100, chosen)
    maskable = 400 * 60
    assert abs(chosen.sum().item() / maskable - 0.15) < 4 * (0.15 * 0.85 / maskable) ** 0.5
    as_mask = (masked["input_ids"][chosen] == tokenizer.mask_token_id).float().mean().item()
    assert abs(as_mask - 0.8) < 4 * (0.8 * 0.2 / chosen.sum().item()) ** 0.5


def test_evaluation_masks_each_example_the_same_in_any_batch():
    from convattn.training.pretrain.data import MaskingCollator

    tokenizer = word_tokenizer()
    examples = [tokenizer(" ".join(WORDS[i:i + 3 + i % 7])) for i in range(10)]
    collate = MaskingCollator(tokenizer, 0.3, seed=0, per_example=True)
    together = collate(examples)
    for i, example in enumerate(examples):
        alone = collate([example])
        length = alone["input_ids"].shape[1]
        assert torch.equal(together["labels"][i, :length], alone["labels"][0])
        assert torch.equal(together["input_ids"][i, :length], alone["input_ids"][0])
        assert (together["labels"][i, length:] == -100).all()
    assert (together["labels"] != -100).any()


def rows_of(tokenizer, rng: random.Random, count: int, formatted: bool) -> list[dict]:
    """Rows as the formatted cache holds them (input ids, token types, special-token masks: no attention mask) or as
    the tokenizer returns them (with one), of 1 to 22 tokens, some a multiple of the padding's 8."""
    rows = []
    for _ in range(count):
        text = " ".join(rng.choices(WORDS, k=rng.choice([1, 6, 8, 14, 16, 22])))
        row = tokenizer(text, return_token_type_ids=True, return_special_tokens_mask=formatted,
                        return_attention_mask=not formatted)
        rows.append({key: list(value) for key, value in row.items()})
    return rows


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("formatted", [True, False])
@pytest.mark.parametrize("count", [1, 5, 16])
def test_the_collators_padding_is_the_tokenizers_value_for_value(side, formatted, count):
    """The collators fill arrays where tokenizer.pad builds tensors from nested lists (benchmarks/collate.py); the
    batch is tokenizer.pad's: every column, its values, dtype and shape, on either padding side."""
    from convattn.training.pretrain.data import PAD_MULTIPLE, padded

    tokenizer = word_tokenizer()
    tokenizer.padding_side = side
    rows = rows_of(tokenizer, random.Random(count), count, formatted)
    ours = padded(rows, tokenizer)
    theirs = tokenizer.pad(rows, pad_to_multiple_of=PAD_MULTIPLE, return_tensors="pt")
    assert ours is not None and set(ours) == set(theirs)
    for column, values in theirs.items():
        assert ours[column].dtype == values.dtype and torch.equal(ours[column], values), column


def test_rows_the_fast_padding_does_not_know_are_padded_by_transformers():
    from convattn.training.pretrain.data import padded

    tokenizer = word_tokenizer()
    rows = rows_of(tokenizer, random.Random(0), 3, formatted=True)
    assert padded([row | {"offset_mapping": [(0, 0)] * len(row["input_ids"])} for row in rows], tokenizer) is None
    assert padded([{key: torch.tensor(value) for key, value in row.items()} for row in rows], tokenizer) is None
    tokenizer.model_input_names = ["input_ids", "token_type_ids"]  # no attention mask: tokenizer.pad makes none
    assert padded(rows, tokenizer) is None


@pytest.mark.parametrize("per_example", [False, True])
def test_the_masking_collator_masks_as_transformers_collator_does_with_the_same_generator(per_example, monkeypatch):
    """The masked inputs, labels and every other column are those of DataCollatorForLanguageModeling's own call
    (tokenizer.pad's padding) with the generator the collator seeds from the rows: the fast padding changes no
    number a run reports."""
    from convattn.training.pretrain import data

    tokenizer = word_tokenizer()
    rows = rows_of(tokenizer, random.Random(1), 40, formatted=True)
    ours = data.MaskingCollator(tokenizer, 0.3, seed=5, per_example=per_example)(rows)
    monkeypatch.setattr(data, "padded", lambda features, tokenizer: None)  # transformers' collator pads and masks
    theirs = data.MaskingCollator(tokenizer, 0.3, seed=5, per_example=per_example)(rows)
    assert set(ours) == set(theirs) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    for column, values in theirs.items():
        assert ours[column].dtype == values.dtype and torch.equal(ours[column], values), column
    assert (ours["labels"] != -100).sum() > 20 and (ours["attention_mask"] == 0).any()


# The masks of seed 0 over three rows of 6, 14 and 16 tokens at a 30 % rate (transformers 5.x's masking draws):
# the (row, position) of every masked token, in training and in evaluation
PINNED_MASKS = {
    False: [[0, 0], [0, 3], [0, 4], [0, 5], [1, 1], [1, 2], [1, 5], [1, 9], [1, 12], [2, 3], [2, 5], [2, 7], [2, 9],
            [2, 12]],
    True: [[0, 2], [0, 3], [0, 4], [1, 4], [1, 6], [1, 10], [1, 12], [2, 2], [2, 3], [2, 7], [2, 12], [2, 15]],
}


@pytest.mark.parametrize("per_example", [False, True], ids=["training", "evaluation"])
def test_a_seed_masks_the_same_tokens_as_it_always_has(per_example):
    """Which tokens a seed masks is part of every number a run reports (its eval perplexity, a comparison's paired
    differences): pinned. A change here (a transformers release that draws its masks otherwise, a new seeding)
    makes runs disagree with earlier ones of the same seed and must be said where users read it, not found later."""
    from convattn.training.pretrain.data import MaskingCollator

    tokenizer = word_tokenizer()
    rows = rows_of(tokenizer, random.Random(3), 3, formatted=True)
    assert [len(row["input_ids"]) for row in rows] == [6, 14, 16]
    batch = MaskingCollator(tokenizer, 0.3, seed=0, per_example=per_example)(rows)
    assert (batch["labels"] != -100).nonzero().tolist() == PINNED_MASKS[per_example]


def test_electras_padding_collator_pads_as_transformers_does():
    from convattn.training.pretrain.data import PAD_MULTIPLE, padding_collator

    tokenizer = word_tokenizer()
    rows = rows_of(tokenizer, random.Random(2), 9, formatted=True)
    ours = padding_collator(tokenizer)(rows)
    theirs = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=PAD_MULTIPLE)(rows)
    assert set(ours) == set(theirs) == {"input_ids", "token_type_ids", "special_tokens_mask", "attention_mask"}
    assert all(torch.equal(ours[column], theirs[column]) for column in theirs)


def warm_up_through_the_kernel(monkeypatch, calls: list, backward: list, dtypes: list) -> None:
    """`convattn pretrain` here warms up as on a GPU, its warm-up's passes through the kernel (Triton's interpreter)
    as a GPU's default sends them, padded batches kept padded; each kernel call recorded: (length, a key mask,
    dropout) in `calls`, the queries' dtype in `dtypes`, each backward's length in `backward`."""
    from convattn import padding_free
    from convattn.attention.relative import dispatch
    from convattn.attention.relative.triton import operator
    from convattn.training.pretrain import job, warm_up

    forward, gradients = operator.run_forward, operator.run_backward

    def recorded(*args):
        calls.append((args[0].shape[-2], args[5] is not None, args[11] > 0))
        dtypes.append(args[0].dtype)
        return forward(*args)

    def through_the_kernel(trainer, seq_len):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(padding_free, "UNPAD_BELOW_REAL_FRACTION", {})
            patch.setattr(dispatch, "_triton_serves", lambda implementation, device, dtype: True)
            patch.setattr(operator, "run_forward", recorded)
            patch.setattr(operator, "run_backward", lambda *args: backward.append(args[1].shape[-2]) or
                          gradients(*args))
            return warm_up.warm_up(trainer, seq_len)

    monkeypatch.setattr(job, "warms_kernel", lambda args, model: True)
    monkeypatch.setattr(job, "warm_up", through_the_kernel)


@pytest.mark.slow
def test_a_gpu_run_first_reaches_the_kernel_at_each_batch_shape_and_then_trains_the_same_steps(corpus, finished_run,
                                                                                             tmp_path, monkeypatch,
                                                                                             capsys):
    """On a GPU a run first compiles the fused kernel at the batch shapes it compiles apart (warm_up.py), so that
    compiling does not count on the training clock (22 s of composite's 165 on the 2026-11-30 H200 call). Here on
    CPU (warm_up_through_the_kernel): it reaches the kernel in training (dropout, then the backward) and in
    evaluation at each shape, and the run's weights and eval losses equal the run without it, bit for bit."""
    calls, backward, dtypes = [], [], []
    warm_up_through_the_kernel(monkeypatch, calls, backward, dtypes)
    out = tmp_path / "warmed"
    assert main(tiny_args(corpus, out)) == 0
    # (length, a key mask, dropout): a training pass and an evaluation in each of the 2 layers, at each shape
    assert calls == [(n, masked, dropout) for n, masked in ((32, False), (32, True), (24, True))
                     for dropout in (True, True, False, False)]
    assert backward == [32, 32, 32, 32, 24, 24] and set(dtypes) == {torch.float32}
    assert_same_run(out, finished_run)
    assert "pretrain: warm-up before the clock: the batch shapes the fused kernel compiles apart" in \
        capsys.readouterr().err


def test_batches_are_collated_by_worker_processes_on_a_gpu_only(monkeypatch):
    from convattn.training.pretrain.trainer import LOADER_WORKERS, loader_workers

    assert loader_workers(use_cpu=True) == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert loader_workers(use_cpu=False) == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert loader_workers(use_cpu=False) == LOADER_WORKERS > 0 and loader_workers(use_cpu=True) == 0


@pytest.mark.slow
def test_worker_processes_collate_the_same_run_through_an_interruption(corpus, finished_run, tmp_path, monkeypatch):
    """On a GPU, worker processes collate the batches beside the steps (trainer.loader_workers): a run interrupted
    and resumed with them is the one the main process collates uninterrupted, weight for weight and evaluation for
    evaluation (here on CPU, the workers forced); they start once a run (persistent), and the tokenizers, done by
    then, are told not to warn at each fork."""
    from torch.utils.data import DataLoader

    from convattn.cli import build_parser
    from convattn.denormals import flush_denormals
    from convattn.training.pretrain import trainer as pretrain_trainer

    monkeypatch.setattr(pretrain_trainer, "loader_workers", lambda use_cpu: 2)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "")  # so that the test's end restores its absence
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    loaders = []
    made = DataLoader.__init__

    def recorded(self, *args, **kwargs):
        made(self, *args, **kwargs)
        loaders.append((self.num_workers, self.persistent_workers))
    monkeypatch.setattr(DataLoader, "__init__", recorded)
    out = tmp_path / "workers"
    flush_denormals()  # as the command line starts a run, so that its resume below moves no setting
    summary = pretrain(options_from_args(build_parser().parse_args(tiny_args(corpus, out))),
                       callbacks=[InterruptAt(5)])
    assert summary.interrupted and os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert main(tiny_args(corpus, out, "--resume")) == 0
    assert loaders and set(loaders) == {(2, True)}
    assert_same_run(out, finished_run)


def test_a_collating_worker_stops_on_sigterm_as_on_ctrl_c(monkeypatch):
    """torch's worker dies of a SIGTERM its parent did not send (a scheduler's, to the whole process group), which the
    main process then reported as a crash over its own orderly stop: our collators make a worker's SIGTERM a
    KeyboardInterrupt, which torch's worker loop ends cleanly. Outside a worker nothing changes."""
    import signal

    from convattn.training.pretrain import data

    tokenizer = word_tokenizer()
    rows = rows_of(tokenizer, random.Random(0), 2, formatted=True)
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(data, "_worker_stops_set", False)
    data.MaskingCollator(tokenizer, 0.15, 0)(rows)
    assert signal.getsignal(signal.SIGTERM) is before and not data._worker_stops_set
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())  # as in a worker
    try:
        data.padding_collator(tokenizer)(rows)
        assert signal.getsignal(signal.SIGTERM) is data._stop and data._worker_stops_set
        with pytest.raises(KeyboardInterrupt):
            data._stop(signal.SIGTERM, None)
    finally:
        signal.signal(signal.SIGTERM, before)


KILLED_RUN = """
import sys
from pathlib import Path

sys.path.insert(0, {tests!r})
from helpers.pretrain import tiny_args

from convattn.cli import main
from convattn.training.pretrain import trainer

trainer.loader_workers = lambda use_cpu: 2  # as on a GPU
sys.exit(main(tiny_args(Path({corpus!r}), Path({out!r}), "--max-steps", "100000", "--save-every", "50",
                        "--eval-every", "40")))
"""


@pytest.mark.slow
def test_a_sigterm_to_the_process_group_stops_a_run_with_workers_cleanly(corpus, tmp_path):
    """A job scheduler's SIGTERM reaches the run and its collating workers at once: the run stops as on Ctrl-C (its
    summary, its last checkpoint to resume from), with no worker's death reported and no process left behind."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "killed"
    script = tmp_path / "run.py"
    script.write_text(KILLED_RUN.format(tests=str(Path(__file__).resolve().parents[2]), corpus=str(corpus),
                                        out=str(out)))
    run = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        for _ in range(1200):  # until the first checkpoint and an evaluation (the eval loader's workers) exist
            if (out / "checkpoints").is_dir() and len(list((out / "checkpoints").glob("checkpoint-*"))) >= 2:
                break
            assert run.poll() is None, run.stdout.read()
            time.sleep(0.25)
        os.killpg(run.pid, signal.SIGTERM)
        output, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert "pretraining interrupted" in output and "continue with: convattn pretrain" in output, output[-2000:]
    assert "Traceback" not in output and "killed by signal" not in output, output[-3000:]
    assert not in_group(run.pid)  # none left


def in_group(group: int) -> list[int]:
    """The processes of process group `group` (Linux's /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                found += [int(entry.name)] if os.getpgid(int(entry.name)) == group else []
    return found


@pytest.mark.slow
def test_the_warm_up_compiles_the_kernel_in_the_trainings_precision(corpus, tmp_path, monkeypatch):
    """The Trainer puts bf16 autocast on the model's forward only when training begins: the warm-up, before it,
    takes the training's precision itself, or it would compile the kernel for float32 and a bf16 run would compile
    again inside its first step."""
    calls, backward, dtypes = [], [], []
    warm_up_through_the_kernel(monkeypatch, calls, backward, dtypes)
    assert main(tiny_args(corpus, tmp_path / "bf16", "--precision", "bf16", "--max-steps", "3")) == 0
    assert len(calls) == 12 and set(dtypes) == {torch.bfloat16}


@pytest.mark.parametrize(("seq_len", "expected"), [
    (128, [(128, (128,)), (128, (128, 64)), (120, (120, 60))]),
    (100, [(104, (100,)), (104, (100, 50)), (96, (96, 48))]),  # 100 tokens pad to 104: every batch has a mask
    (8, [(8, (8,)), (8, (8, 4))]),  # no shorter multiple of 8 with another remainder by 16
    (16, [(16, (16,)), (16, (16, 8)), (8, (8, 4))]),  # the shortest multiple of 8 is one
])
def test_the_warm_up_shapes_are_what_the_collators_pad_training_batches_to(seq_len, expected):
    """The longest batch without padding, with padding, and the longest whose remainder by 16 differs (Triton
    specialises on it): each shape's rows, collated as training and evaluation collate them, pad to its length."""
    from convattn.training.pretrain.data import MaskingCollator
    from convattn.training.pretrain.warm_up import features, warm_shapes

    assert warm_shapes(seq_len) == expected
    tokenizer = word_tokenizer()
    for per_example in (False, True):
        collator = MaskingCollator(tokenizer, 0.15, 0, per_example=per_example)
        for padded, lengths in expected:
            rows = features(tokenizer, lengths, 3, len(tokenizer))
            batch = collator(rows)
            assert batch["input_ids"].shape == (3, padded)
            assert batch["attention_mask"].sum(1).tolist() == [lengths[k % len(lengths)] for k in range(3)]
            assert all(row["input_ids"][0] == tokenizer.cls_token_id and row["input_ids"][-1] == tokenizer.sep_token_id
                       for row in rows)


def test_only_a_model_on_the_gpu_warms_up():
    """On CPU nothing compiles at a first call; with FSDP the model reaches the GPU only when training begins."""
    from types import SimpleNamespace

    from convattn.training.pretrain.warm_up import warms_kernel

    model = torch.nn.Linear(2, 2)
    assert not warms_kernel(SimpleNamespace(device=torch.device("cpu")), model)
    assert not warms_kernel(SimpleNamespace(device=torch.device("cuda")), model)


@pytest.mark.parametrize("training", [True, False])
def test_the_warm_up_passes_each_shape_as_the_trainer_would_and_leaves_nothing_changed(training):
    """On a stand-in trainer: at each shape a training pass (train mode, the training's precision, the training
    collator and batch size) and an evaluation forward (eval mode, no gradients, the evaluation's collator and batch
    size); after it the random generator draws what it would have, no gradient is left, the weights are those it
    found and the model is in the mode it found (a warm-up that changed any of these would change the run)."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from convattn.training.pretrain.warm_up import warm_shapes, warm_up

    passes = []
    model = torch.nn.Sequential(torch.nn.Embedding(len(word_tokenizer()), 4), torch.nn.Dropout(0.5))
    model.get_input_embeddings = lambda: model[0]
    model.train(training)

    def collator(kind):
        return lambda rows: {"kind": kind, "input_ids": torch.nn.utils.rnn.pad_sequence(
            [torch.tensor(row["input_ids"]) for row in rows], batch_first=True)}

    class Trainer:
        args = SimpleNamespace(device=torch.device("cpu"), per_device_train_batch_size=3,
                               per_device_eval_batch_size=5)
        processing_class = word_tokenizer()
        precise = False

        @property
        def accelerator(self):
            @contextmanager
            def autocast():
                self.precise = True
                yield
                self.precise = False
            return SimpleNamespace(autocast=autocast)

        def _prepare_inputs(self, batch):
            return batch

        def compute_loss(self, model, inputs):
            passes.append(("loss", inputs["kind"], inputs["input_ids"].shape, model.training, self.precise))
            return model(inputs["input_ids"]).sum()

        def _eval_sums(self, model, inputs):
            passes.append(("eval", inputs["kind"], inputs["input_ids"].shape, model.training, self.precise,
                           torch.is_grad_enabled()))
            model(inputs["input_ids"])

    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    trainer = Trainer()
    trainer.model, trainer.data_collator, trainer.eval_collator = model, collator("train"), collator("eval")
    warm_up(trainer, 16)
    assert torch.equal(torch.rand(4), expected)
    assert passes == [step for padded, _ in warm_shapes(16) for step in (
        ("loss", "train", (3, padded), True, True), ("eval", "eval", (5, padded), False, True, False))]
    assert all(p.grad is None for p in model.parameters()) and model.training == training
    assert all(torch.equal(tensor, weights[name]) for name, tensor in model.state_dict().items())
