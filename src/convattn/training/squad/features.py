"""Questions -> model inputs: BERT/ELECTRA's sliding windows over long contexts.

Each input is `[CLS] question [SEP] context window [SEP]`; the question is cut to `max_query_length` tokens, and
window starts advance by `doc_stride` tokens (BERT's and ELECTRA's meaning of doc stride; the fast tokenizer's
`stride` argument is the overlap instead, so it is set per question to window length - doc stride). A token seen
by several windows belongs, for answer starts, to the window where it has the most context on both sides
(BERT's `_check_is_max_context`: score min(left, right) + 0.01 x window length, first window on ties).
"""

from __future__ import annotations

import time

from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from convattn.console import say
from convattn.data.squad import answer_end
from convattn.training.squad.settings import SquadSettings


class Progress:
    """One 'convattn squad: <what>: k of n <unit>' line every `period` seconds of a long phase; a short phase
    prints nothing."""

    period = 10.0

    def __init__(self, what: str, total: int, unit: str):
        self.what, self.total, self.unit = what, total, unit
        self.done = 0
        self.started = self.shown = time.monotonic()

    def advance(self, count: int, note: str = "") -> None:
        self.done += count
        now = time.monotonic()
        if now - self.shown >= self.period:
            self.shown = now
            say("squad", f"{self.what}: {self.done:,} of {self.total:,} {self.unit}{note} "
                         f"({now - self.started:.0f} s)")


def truncated_question(question: str, tokenizer: PreTrainedTokenizerBase, max_query_length: int) -> str:
    """The question cut after its first `max_query_length` tokens (leading whitespace dropped, as tokenizers do)."""
    question = question.lstrip()
    offsets = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return question if len(offsets) <= max_query_length else question[:offsets[max_query_length - 1][1]]


def token_span(offsets: list, start_char: int, end_char: int) -> tuple[int, int] | None:
    """The first and last context tokens of the characters [start_char, end_char); None if the window misses any."""
    positions = [i for i, o in enumerate(offsets) if o is not None]
    if not positions or offsets[positions[0]][0] > start_char or offsets[positions[-1]][1] < end_char:
        return None
    start = next(i for i in positions if offsets[i][1] > start_char)
    end = next(i for i in reversed(positions) if offsets[i][0] < end_char)
    return start, end


def training_span(offsets: list, context: str, answers: dict) -> tuple[int, int]:
    """The first answer's token span in this window; (0, 0), the [CLS] token, when there is none."""
    if not answers["text"]:
        return 0, 0
    start = answers["answer_start"][0]
    return token_span(offsets, start, answer_end(context, start, answers["text"][0])) or (0, 0)


def max_context_flags(windows: list[list]) -> list[list[bool]]:
    """Per window and token: is this window the one where the token has the most context? (None offsets: False)"""
    starts = sorted({o[0] for offsets in windows for o in offsets if o is not None})
    doc_index = {start: k for k, start in enumerate(starts)}
    spans = []
    for offsets in windows:
        positions = [doc_index[o[0]] for o in offsets if o is not None]
        spans.append((positions[0], len(positions)) if positions else (0, 0))
    best: dict[int, tuple[float, int]] = {}
    for w, (first, length) in enumerate(spans):
        for p in range(first, first + length):
            score = min(p - first, first + length - 1 - p) + 0.01 * length
            if p not in best or score > best[p][0]:
                best[p] = (score, w)
    return [[o is not None and best[doc_index[o[0]]][1] == w for o in offsets] for w, offsets in enumerate(windows)]


def encode_question(question: str, context: str, tokenizer: PreTrainedTokenizerBase, settings: SquadSettings,
                    token_types: bool) -> dict[str, list]:
    """One question -> its windows: input ids, masks and `context_offsets` (character span per context token)."""
    question = truncated_question(question, tokenizer, settings.max_query_length)
    question_tokens = len(tokenizer(question, add_special_tokens=False)["input_ids"])
    special = tokenizer.num_special_tokens_to_add(pair=True)
    window = settings.max_length - question_tokens - special
    if window <= 0:
        raise ValueError(f"max_length {settings.max_length} leaves no room for the context after a question of "
                         f"{question_tokens} tokens; raise max_length or lower max_query_length")
    encoded = tokenizer(question, context, truncation="only_second", max_length=settings.max_length,
                        stride=max(window - settings.doc_stride, 0), return_overflowing_tokens=True,
                        return_offsets_mapping=True, return_token_type_ids=token_types)
    windows = []
    for w in range(len(encoded["input_ids"])):
        sequence = encoded.sequence_ids(w)
        windows.append([tuple(o) if sequence[i] == 1 else None for i, o in enumerate(encoded["offset_mapping"][w])])
    features = {key: encoded[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in encoded}
    features["context_offsets"] = windows
    return features


def encode_split(dataset: Dataset, tokenizer: PreTrainedTokenizerBase, settings: SquadSettings, token_types: bool,
                 training: bool) -> Dataset:
    """Questions -> one row per window. Training rows carry start/end positions (answer outside the window or no
    answer: both 0, the [CLS] token, as BERT and ELECTRA train); evaluation rows carry the question id, the
    context offsets and the max-context flags that post-processing needs. For the joint head, every row also
    has ELECTRA's answer mask (context tokens and [CLS]) and training rows `is_impossible`."""
    joint = settings.head == "joint"
    progress = Progress(f"windows of the {'training' if training else 'dev'} questions", len(dataset), "questions")
    windows_made = 0

    def encode(batch: dict[str, list]) -> dict[str, list]:
        nonlocal windows_made
        rows: dict[str, list] = {}
        for i, question in enumerate(batch["question"]):
            features = encode_question(question, batch["context"][i], tokenizer, settings, token_types)
            windows = features.pop("context_offsets")
            if joint:
                features["answer_mask"] = [[int(k == 0 or o is not None) for k, o in enumerate(offsets)]
                                           for offsets in windows]
            if training:
                spans = [training_span(offsets, batch["context"][i], batch["answers"][i]) for offsets in windows]
                features["start_positions"] = [s for s, _ in spans]
                features["end_positions"] = [e for _, e in spans]
                if joint:
                    features["is_impossible"] = [int(not batch["answers"][i]["text"])] * len(windows)
            else:
                features["example_id"] = [batch["id"][i]] * len(windows)
                features["context_offsets"] = [[list(o) if o else None for o in offsets] for offsets in windows]
                features["max_context"] = max_context_flags(windows)
            for key, values in features.items():
                rows.setdefault(key, []).extend(values)
        windows_made += len(rows.get("input_ids", ()))
        progress.advance(len(batch["question"]), f", {windows_made:,} windows so far")
        return rows

    return dataset.map(encode, batched=True, batch_size=256, remove_columns=dataset.column_names)
