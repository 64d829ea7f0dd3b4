"""Denormal floats: the command line flushes them in every thread of its process (convattn.denormals), gives an
in-process caller its own state back, and runs record which it was."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from convattn.denormals import denormals_flushed, set_denormals
from convattn.runs.environment import changes, describe, environment

# 2^-127 made from its bits, times 4: zero only in a thread that reads denormals as zero; 4M elements, which torch
# splits over its threads
PROBE = """
import torch

def every_thread_flushes():
    x = torch.full((1 << 22,), 0x00400000, dtype=torch.int32).view(torch.float32)
    return bool(((x * 4.0) == 0).all())
"""


def run_python(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", PROBE + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


@pytest.fixture(scope="module")
def cpu_flushes():
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU has no flag to flush denormal floats (torch.set_flush_denormal says so)")


def test_flushing_before_the_first_parallel_region_reaches_every_thread(cpu_flushes):
    before, threads, numpy_subnormal = run_python("""
        import numpy
        torch.set_num_threads(2)
        from convattn.denormals import denormals_flushed, flush_denormals
        before = flush_denormals()
        print(before, every_thread_flushes(), numpy.finfo(numpy.float32).smallest_subnormal.tobytes().hex())
    """)
    # kept at the start; then flushed in both threads; numpy's limits computed before, so numpy does not warn
    # (-W error) and holds its smallest denormal (which a comparison now reads as zero)
    assert (before, threads, numpy_subnormal) == ("False", "True", "01000000")


def test_the_command_line_flushes_for_its_command_and_gives_its_caller_its_state_back(cpu_flushes):
    inside, main_after, before = run_python("""
        import argparse
        torch.set_num_threads(2)
        from convattn import cli
        from convattn.denormals import denormals_flushed

        seen = []
        build = cli.build_parser

        def probing_parser():
            parser = build()
            commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            commands.choices["pretrain"].set_defaults(func=lambda args: seen.append(every_thread_flushes()))
            return parser

        cli.build_parser = probing_parser
        before = denormals_flushed()
        assert cli.main(["pretrain"]) == 0
        print(seen[0], denormals_flushed(), before)
    """)
    assert (inside, main_after, before) == ("True", "False", "False")


def test_a_command_that_fails_gives_the_state_back_too(cpu_flushes):
    from convattn import cli

    set_denormals(False)
    assert cli.main(["pretrain", "--lr", "-1"]) == 2
    assert not denormals_flushed()


def test_the_run_records_whether_denormals_were_flushed_and_a_resume_says_when_that_moved(cpu_flushes):
    try:
        set_denormals(True)
        flushed = environment(torch.device("cpu"), processes=1, precision="fp32")
    finally:
        set_denormals(False)
    kept = environment(torch.device("cpu"), processes=1, precision="fp32")
    assert (flushed["denormals"], kept["denormals"]) == ("flushed", "kept")
    assert changes(kept, flushed) == ["denormals kept -> flushed"]
    older = {key: value for key, value in kept.items() if key != "denormals"}  # a record from before the field
    assert changes(older, flushed) == ["denormals not recorded -> flushed"]
    assert "denormals flushed" in describe(flushed)


def test_alibi_on_a_cpu_thread_that_keeps_denormals_says_once_how_to_flush_them(cpu_flushes, monkeypatch):
    import warnings

    from convattn import ConvAttnConfig, ConvAttnModel
    from convattn.attention.relative import dispatch

    monkeypatch.setattr(dispatch, "_denormals_said", False)
    config = ConvAttnConfig.from_preset("chang2021-small/alibi", num_hidden_layers=1, hidden_size=32,
                                        num_attention_heads=4, intermediate_size=64, vocab_size=100)
    model = ConvAttnModel(config).eval()
    short, long = torch.randint(5, 100, (1, 300)), torch.randint(5, 100, (1, 400))  # slope 1/4: -75, then -100
    set_denormals(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(short)  # the bias stays above the denormal range
    with pytest.warns(RuntimeWarning, match=r"over 400 tokens make denormal floats.*torch.set_flush_denormal\(True\)"):
        model(long)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(long)  # once a process
        monkeypatch.setattr(dispatch, "_denormals_said", False)
        set_denormals(True)
        model(long)  # flushed: nothing to say
