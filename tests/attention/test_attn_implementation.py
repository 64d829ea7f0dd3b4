"""transformers' attention interface: `attn_implementation` at load time and `set_attn_implementation` at run
time choose how every mechanism computes attention, read at each forward; configs saved with the field's old
name, `attention_backend`, still load. A name that is unknown, or a kernel that cannot run here (triton missing, a
CPU without its interpreter, an interpreter with a numpy it fails with) is one error when it is chosen."""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types

import numpy
import pytest
import torch
from helpers.remote import run_without_convattn
from helpers.tiny import randomize_, tiny_config
from transformers import BertConfig, BertModel

from convattn import ConvAttnConfig, ConvAttnModel
from convattn.attention.relative import dispatch
from convattn.electra import ConvAttnForPreTraining


@pytest.fixture
def recorded_paths(monkeypatch):
    """The path each relative-attention call took."""
    taken = []
    original = dispatch.relative_path
    monkeypatch.setattr(dispatch, "relative_path", lambda *args: taken.append(original(*args)) or taken[-1])
    return taken


def saved_model(tmp_path, preset="chang2021-small/composite", **overrides):
    model = ConvAttnModel(tiny_config(preset, **overrides))
    randomize_(model)
    model.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("preset, overrides", [
    ("chang2021-small/composite", {}),
    ("chang2021-small/convbert", dict(relative_terms=["fixed", "dynamic_query", "dynamic_key"],
                                      position_embedding_type="none")),
])
def test_set_attn_implementation_switches_a_loaded_model_at_run_time(tmp_path, recorded_paths, preset, overrides):
    model = ConvAttnModel.from_pretrained(saved_model(tmp_path, preset, **overrides)).eval()
    assert model.config._attn_implementation == "sdpa"
    n = dispatch.CPU_DECOMPOSED_MIN_LENGTH + 45  # long enough for "sdpa" to take the decomposition on CPU
    ids = torch.randint(5, 101, (2, n), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones(2, n, dtype=torch.long)
    attention_mask[1, 200:] = 0
    with torch.no_grad():
        sdpa = model(input_ids=ids, attention_mask=attention_mask).last_hidden_state
        model.set_attn_implementation("eager")
        assert model.config._attn_implementation == "eager"
        eager = model(input_ids=ids, attention_mask=attention_mask).last_hidden_state
    assert recorded_paths == ["decomposed"] * 2 + ["dense"] * 2  # two layers each
    real = attention_mask.bool()
    torch.testing.assert_close(eager[real], sdpa[real], rtol=0, atol=1e-6)


def test_set_attn_implementation_reaches_the_electra_generator():
    config = tiny_config("convbert/small", mask_token_id=4, relative_terms=["fixed"])
    model = ConvAttnForPreTraining(config)
    model.set_attn_implementation("eager")
    assert model.convattn.config._attn_implementation == "eager"
    assert model.generator.config._attn_implementation == "eager"
    attention = model.generator.encoder.layer[0].attention.self
    assert attention.config is model.generator.config


def test_from_pretrained_attn_implementation_wins(tmp_path, recorded_paths):
    path = saved_model(tmp_path)
    model = ConvAttnModel.from_pretrained(path, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    assert model.encoder.layer[0].attention.self.config is model.config
    assert ConvAttnModel.from_pretrained(path).config._attn_implementation == "sdpa"
    model(input_ids=torch.ones(1, 5, dtype=torch.long))
    assert recorded_paths == ["dense", "dense"]


def test_legacy_attention_backend_still_loads(tmp_path):
    path = saved_model(tmp_path)
    config_file = path / "config.json"
    fields = json.loads(config_file.read_text())
    assert "attention_backend" not in fields  # one name: only transformers' attn_implementation is saved
    config_file.write_text(json.dumps({**fields, "attention_backend": "eager"}))
    assert ConvAttnModel.from_pretrained(path).config._attn_implementation == "eager"
    assert ConvAttnModel.from_pretrained(path, attn_implementation="sdpa").config._attn_implementation == "sdpa"
    assert not hasattr(ConvAttnConfig.from_pretrained(path), "attention_backend")


def test_unknown_attn_implementation_is_named():
    with pytest.raises(ValueError, match=r"attn_implementation='flash'.*'sdpa', 'eager'"):
        ConvAttnConfig(attn_implementation="flash")
    with pytest.raises(ValueError, match=r"attention_backend='flash'.*'sdpa', 'eager'"):
        ConvAttnConfig(attention_backend="flash")


# --- choosing an implementation that cannot run here is one error, when it is chosen

def triton_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # as if not installed: `import triton` fails, find_spec is None


def fake_triton(monkeypatch, version: str) -> None:
    """An installed triton of `version`, whatever is installed here."""
    module = types.ModuleType("triton")
    module.__spec__, module.__version__ = importlib.machinery.ModuleSpec("triton", None), version
    monkeypatch.setitem(sys.modules, "triton", module)


def cpu_without_interpreter(monkeypatch):
    fake_triton(monkeypatch, "3.6.0")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def interpreter_with_numpy_2_4(monkeypatch):
    fake_triton(monkeypatch, "3.6.0")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(numpy, "__version__", "2.4.1")


UNUSABLE = [
    (triton_missing, "convattn_triton", ImportError,
     "attn_implementation='convattn_triton' needs triton, which is not installed: pip install triton"),
    (cpu_without_interpreter, "convattn_triton", RuntimeError,
     "attn_implementation='convattn_triton' runs on a CUDA GPU, and this machine has none: on CPU set "
     "TRITON_INTERPRET=1 before triton is imported"),
    (interpreter_with_numpy_2_4, "convattn_triton", ImportError,
     "which fails with numpy 2.4.1: pip install \"numpy<2.4\""),
    (lambda monkeypatch: None, "flash", ValueError,
     "attn_implementation='flash' is not allowed; choose one of 'sdpa', 'eager', 'flex_attention', 'convattn_triton'"),
]


def choose_in_config(path, name):
    ConvAttnConfig(attn_implementation=name)


def choose_in_from_pretrained(path, name):
    ConvAttnModel.from_pretrained(path, attn_implementation=name)


def choose_on_a_built_model(path, name):
    model = ConvAttnModel.from_pretrained(path)
    try:
        model.set_attn_implementation(name)
    finally:
        assert model.config._attn_implementation == "sdpa"  # a refused choice changes nothing


def choose_on_the_config_attribute(path, name):
    config = ConvAttnConfig.from_pretrained(path)
    config._attn_implementation = name


def choose_for_a_transformers_bert(path, name):
    """Any encoder through transformers' AttentionInterface: transformers checks only the name, so the first
    forward says it."""
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, attn_implementation=name)
    BertModel(config)(input_ids=torch.ones(1, 4, dtype=torch.long))


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    return saved_model(tmp_path_factory.mktemp("attn"))


CHOICES = [choose_in_config, choose_in_from_pretrained, choose_on_a_built_model, choose_on_the_config_attribute,
           choose_for_a_transformers_bert]


# an unknown name for transformers' own models is transformers' error
@pytest.mark.parametrize(("choose", "situation", "name", "error", "message"),
                         [(choose, *case) for choose in CHOICES for case in UNUSABLE
                          if not (choose is choose_for_a_transformers_bert and case[1] == "flash")])
def test_an_implementation_that_cannot_run_here_is_one_error_when_chosen(saved_tiny, monkeypatch, choose, situation,
                                                                         name, error, message):
    situation(monkeypatch)
    with pytest.raises(error) as caught:
        choose(saved_tiny, name)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_numpy_line_is_for_the_triton_releases_that_need_it(monkeypatch):
    interpreter_with_numpy_2_4(monkeypatch)
    fake_triton(monkeypatch, "3.7.0")
    assert ConvAttnConfig(attn_implementation="convattn_triton")._attn_implementation == "convattn_triton"


def test_a_model_on_cpu_without_the_interpreter_is_told_where_the_kernel_runs(saved_tiny, monkeypatch):
    """With a GPU present the choice stands (the model may move there); a forward on CPU says what to do."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    model = ConvAttnModel.from_pretrained(saved_tiny, attn_implementation="convattn_triton")
    with pytest.raises(RuntimeError, match=r"runs on a CUDA GPU, and this model is on cpu: move it there "
                                           r"\(model.cuda\(\)\), or on CPU set TRITON_INTERPRET=1"):
        model(input_ids=torch.ones(1, 5, dtype=torch.long))


REMOTE_CHOICES = """
import sys
from transformers import AutoConfig, AutoModel

sys.modules["triton"] = None
for choose in (lambda: AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True,
                                                 attn_implementation="convattn_triton"),
               lambda: setattr(AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=True),
                               "_attn_implementation", "flash")):
    try:
        choose()
    except Exception as error:
        print(type(error).__name__, error)
"""


@pytest.mark.slow
def test_the_modeling_code_saved_with_a_model_refuses_the_same(saved_tiny, tmp_path):
    ran = run_without_convattn(tmp_path, REMOTE_CHOICES, str(saved_tiny))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "ImportError attn_implementation='convattn_triton' needs triton, which is not installed: pip install triton",
        "ValueError attn_implementation='flash' is not allowed; choose one of 'sdpa', 'eager', 'flex_attention', "
        "'convattn_triton'"]
