"""The fused kernel compiled before a GPU run's training clock starts.

Triton compiles the kernel at its first call for each specialisation it meets (a key mask or none, a length that
is a multiple of 16 or not, training with dropout and a backward or evaluation with neither) and autotunes its
tilings there. Inside the first training step that time would count on the step's clock (a GPU's clock runs while
the host compiles) and on no SDPA model's: on the 2026-11-30 H200 call composite's first step took 22 s of its
165 s budget. `warm_up` runs one training pass and one evaluation forward at each of the batch shapes the kernel
compiles apart, through the trainer's own collators, loss and precision, before training begins, and leaves the
random generators, the gradients and the model's mode as it found them: the run trains the same steps as without
it. Compiled kernels and the autotuner's picks stay in Triton's disk cache, so a later run spends seconds here.
"""

from __future__ import annotations

import time

import torch

from convattn.training.pretrain.data import PAD_MULTIPLE


def warms_kernel(args, model: torch.nn.Module) -> bool:
    """Whether a run warms up first: on a GPU, where relative terms take the fused kernel by default (on CPU no path
    compiles at its first call; `torch.compile`'s own tracing is left to the first step, alike for every model),
    with the model already there (FSDP places it only when training begins)."""
    return args.device.type == "cuda" and next(model.parameters()).device.type == "cuda"


def warm_shapes(seq_len: int, multiple: int = PAD_MULTIPLE) -> list[tuple[int, tuple[int, ...]]]:
    """(padded length, the rows' real lengths, repeated over the batch) of the batches the kernel compiles apart:
    the longest batch without padding (no key mask), the same with padding, and the longest padded length whose
    remainder by 16 differs (Triton specialises integer arguments on divisibility by 16)."""
    longest = -(-seq_len // multiple) * multiple
    shapes = [(longest, (seq_len,)), (longest, (seq_len, max(1, seq_len // 2)))]
    other = next((n for n in range(longest - multiple, 0, -multiple) if (n % 16 == 0) != (longest % 16 == 0)), None)
    if other is not None:
        shapes.append((other, (other, max(1, other // 2))))
    return shapes


def features(tokenizer, lengths: tuple[int, ...], batch_size: int, vocab_size: int) -> list[dict]:
    """`batch_size` rows as the formatted datasets hold them (input_ids, token_type_ids, special_tokens_mask),
    row k of length lengths[k % len(lengths)]: [CLS], ordinary tokens, [SEP]."""
    special = set(tokenizer.all_special_ids)
    ordinary = next(token for token in range(vocab_size) if token not in special)
    first, last = (ordinary if token is None else token for token in (tokenizer.cls_token_id, tokenizer.sep_token_id))
    rows = []
    for row in range(batch_size):
        n = lengths[row % len(lengths)]
        ids = [first, *[ordinary] * max(0, n - 2), last][:n]
        rows.append({"input_ids": ids, "token_type_ids": [0] * n,
                     "special_tokens_mask": [1, *[0] * max(0, n - 2), 1][:n]})
    return rows


def warm_up(trainer, seq_len: int) -> float:
    """One training pass (forward, loss and backward, dropout on) and one evaluation forward of `trainer`'s model
    at each of `warm_shapes(seq_len)`, as its training and evaluation batches reach it; nothing it changes outlives
    it (generators, gradients, the model's mode). Returns the seconds it took."""
    started = time.perf_counter()
    model, args = trainer.model, trainer.args
    tokenizer = trainer.processing_class
    vocab_size = model.get_input_embeddings().num_embeddings
    devices = [args.device] if args.device.type == "cuda" else []
    evaluation = trainer.eval_collator or trainer.data_collator
    was_training = model.training
    # the training's precision: accelerate puts autocast on the model's forward only when train() prepares it
    precision = trainer.accelerator.autocast  # a context per use
    try:
        with torch.random.fork_rng(devices=devices):
            for _padded, lengths in warm_shapes(seq_len):  # the collators pad to it
                model.train()
                batch = trainer.data_collator(features(tokenizer, lengths, args.per_device_train_batch_size,
                                                       vocab_size))
                with precision():
                    loss = trainer.compute_loss(model, trainer._prepare_inputs(batch))
                loss.backward()
                model.zero_grad(set_to_none=True)
                model.eval()
                batch = evaluation(features(tokenizer, lengths, args.per_device_eval_batch_size, vocab_size))
                with torch.no_grad(), precision():
                    trainer._eval_sums(model, trainer._prepare_inputs(batch))
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    if devices:
        torch.cuda.synchronize(args.device)
    return time.perf_counter() - started
