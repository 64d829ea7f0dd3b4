"""Every fenced command and Python block of README.md and docs/*.md runs as written, or is left out by a rule below
that says why.

Shell blocks (bash, sh, console) are cut into commands (`\\` continuations joined, `&&` split, comments dropped),
and each command is placed by `place`: a `convattn` command is parsed by the CLI's own parser (so every documented
flag exists), then run end to end in a scratch copy of a workspace where the documents' paths exist, with tiny
settings put in place of the documented sizes, unless a rule says why not (the network, minutes of work, data the
tests do not have). Commands of other programs are placed by an explicit rule too; a command no rule places fails
the test, so a new kind of command gets a reviewed rule. Python blocks run in such a workspace unless a rule in
PYTHON_RULES says otherwise. Blocks in other languages fail unless named in SHOWN_ONLY.

The workspace (`workspace`, once per module): `corpus/` and `valid.txt` (random sentences), `glue_data/` (the
SST-2 / CoLA fixture), the SQuAD fixture's JSON files, and `runs/pretrain-default`, a tiny pretraining run in the
place of the set-up command's (whose embedded corpus takes minutes)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
import warnings
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
from helpers.finetune import GLUE_DATA, SQUAD
from helpers.pretrain import write_corpus
from helpers.remote import run_without_convattn

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "console"}
SHOWN_ONLY = {"text": "a listing (the source layout), not a command"}
README_MAX_LINES = 150

# the sizes a documented command is run at (a flag the command has is replaced, a missing one appended)
TINY_PRETRAINING = {"--layers": "2", "--hidden": "32", "--heads": "4", "--intermediate": "64",
                    "--embedding-size": "16", "--vocab-size": "150", "--seq-len": "32", "--batch-size": "8",
                    "--max-steps": "4", "--eval-every": "4", "--save-every": "4", "--log-every": "2",
                    "--warmup": "2", "--eval-samples": "24"}
TINY = {
    "pretrain": TINY_PRETRAINING,
    "compare": {**TINY_PRETRAINING, "--seeds": "1"},
    "plot kernel-size": {**TINY_PRETRAINING, "--seeds": "1", "--kernel-sizes": "3,5"},
    "glue": {"--seeds": "1", "--max-steps": "2", "--max-train-samples": "16"},
    "squad": {"--seeds": "1", "--max-steps": "2", "--max-length": "48", "--doc-stride": "16",
              "--max-query-length": "12"},
}
TINY_GLUE_IN_COMPARE = {"--glue-max-steps": "2", "--glue-max-train-samples": "16"}
FIXTURE_GLUE_TASKS = {"sst2", "cola"}  # what tests/fixtures/glue_data holds
# where a documented local path may start (anything else given to --model is a hub id)
LOCAL_PREFIXES = ("runs/", "./", "../", "/", "~")

# Python blocks: the first rule whose pattern the block holds places it; the rest run in-process in a workspace
PYTHON_RULES = [
    (re.compile(r'from_transformers\("YituTech/'), "skip",
     "downloads a published ConvBERT checkpoint from the Hub (network); tests/interop/ converts local ones"),
    (re.compile(r"no `import convattn` needed"), "without convattn",
     "claims to run where convattn is not installed: run in a subprocess that cannot import it"),
]


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence
    lang: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    blocks, opened, lines = [], None, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = re.fullmatch(r"```(\S*)\s*", line)
        if fence and opened is None:
            opened, lines = (number, fence[1]), []
        elif fence and opened is not None:
            assert not fence[1], f"{path.name}:{number}: a fence opens inside the block opened at line {opened[0]}"
            blocks.append(Block(str(path.relative_to(ROOT)), opened[0], opened[1], "\n".join(lines) + "\n"))
            opened = None
        elif opened is not None:
            lines.append(line)
    assert opened is None, f"{path.name}:{opened[0]}: the block is never closed"
    return blocks


BLOCKS = [block for page in PAGES for block in fenced_blocks(page)]


@dataclass
class Command:
    block: Block
    line: int
    words: list[str]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.block.page}:{self.line} {' '.join(self.words)[:70]}"


def shell_commands(block: Block) -> list[Command]:
    """The block's commands: continuation lines joined, `# comments` dropped, `a && b` as two commands, leading
    NAME=value words as the command's environment; in a console block only the `$ ` lines."""
    commands, pending, start = [], "", None
    for number, line in enumerate(block.code.splitlines(), block.line + 1):
        if block.lang == "console":
            if not line.startswith("$ ") and not pending:
                continue
            line = line.removeprefix("$ ")
        start = start or number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words, pending = shlex.split(pending + line, comments=True), ""
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            env = {}
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                name, value = words.pop(0).split("=", 1)
                env[name] = value
                cut -= 1
            commands.append(Command(block, start, words[:cut], env))
            words = words[cut + 1:]
        start = None
    return commands


SHELL_BLOCKS = [block for block in BLOCKS if block.lang in SHELL]
COMMANDS = [command for block in SHELL_BLOCKS for command in shell_commands(block)]
PYTHON_BLOCKS = [block for block in BLOCKS if block.lang == "python"]


@cache
def cli_parser():
    from convattn.cli import build_parser

    return build_parser()


def parse_convattn(words: list[str]):
    """The CLI's own parser on a documented `convattn` command (argparse exits on an unknown flag or a bad value:
    that is the test's failure, with argparse's message)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return cli_parser().parse_args(words)
    except SystemExit:
        pytest.fail(f"`convattn {' '.join(words)}` does not parse: {err.getvalue().strip()}")


def after_module(words: list[str], module: str) -> tuple[list[str], list[str]]:
    """`LAUNCHER ... -m MODULE ARGS ...` -> (the launcher's words, ARGS without a trailing `...`)."""
    index = next((i for i in range(len(words) - 1) if words[i:i + 2] == ["-m", module]), None)
    assert index is not None, f"{' '.join(words)}: no `-m {module}`"
    args = words[index + 2:]
    return words[:index + 2], args[:-1] if args[-1:] == ["..."] else args


@dataclass
class Placement:
    kind: str  # "run" (end to end, tiny), "parse" (parsed only), "skip" (not a convattn command, not run)
    reason: str = ""
    argv: list[str] = field(default_factory=list)  # convattn's arguments, for "run" and "parse"


def place(command: Command) -> Placement:
    """Where a documented command goes; an AssertionError for a command no rule places."""
    words = command.words
    program = words[0]
    if program == "pip":
        return Placement("skip", "installs packages (network)")
    if words[:3] in (["python3", "-m", "pytest"], ["python", "-m", "pytest"]):
        return Placement("skip", "the test suite itself (CI runs it; test_readme_test_command_is_ci_s checks it)")
    if program in ("hf", "huggingface-cli"):
        return Placement("skip", "logs in to the Hugging Face Hub (network)")
    if program == "torchrun":
        argv = after_module(words, "convattn")[1]
        parse_convattn(argv)
        return Placement("parse", "starts several processes (tests/training/pretrain/test_distributed.py runs "
                                  "torchrun over 2 CPU processes)", argv)
    if words[:2] == ["accelerate", "launch"]:
        argv = after_module(words, "convattn")[1]
        parse_convattn(argv)
        return Placement("parse", "accelerate on GPUs (tests/training/pretrain/test_fsdp.py checks "
                                  "examples/fsdp2.yaml)", argv)
    if program == "bash" and words[1] == "benchmarks/gpu_session.sh":
        return Placement("skip", "a GPU session (tests/benchmarks/test_gpu_session.py runs its --rehearse)")
    if program in ("python", "python3") and re.fullmatch(r"benchmarks/\w+\.py", words[1]):
        return Placement("skip", "a benchmark: minutes of measurements (tests/benchmarks/test_scripts.py starts "
                                 "every script)")
    assert program == "convattn", f"{command.id}: no rule places a `{program}` command; add one to place()"
    return place_convattn(words[1:])


def is_hub_id(value: str | None) -> bool:
    return value is not None and not value.startswith(LOCAL_PREFIXES)


def place_convattn(argv: list[str]) -> Placement:
    args = parse_convattn(argv)
    command = args.command if args.command != "plot" else f"plot {args.plot_kind}"
    get = lambda name: getattr(args, name, None)  # noqa: E731
    network = [
        (command == "push", "uploads to the Hugging Face Hub"),
        (get("dataset") is not None, "reads a hub dataset"),
        (is_hub_id(get("model")), "reads a model from the Hub"),
        (command == "glue" and get("data_dir") is None, "reads GLUE from the Hub"),
        (command == "squad" and (get("train_file") is None or get("dev_file") is None), "reads SQuAD from the Hub"),
        (bool(get("glue")) and get("glue_data_dir") is None, "reads GLUE from the Hub"),
        (bool(get("squad")) and get("squad_train_file") is None, "reads SQuAD from the Hub"),
    ]
    costly = [
        (any(word.startswith("../shared/") for word in argv), "reads ../shared/data, the project's data sets"),
        (command in ("pretrain", "compare", "plot kernel-size") and not get("train_file") and not get("dataset")
         and not get("report_only"),
         "the embedded corpus: extracting and tokenizing it takes minutes"),
        (bool(get("grid")), "trains a whole grid of presets"),
        (command == "export", "an ONNX export takes several seconds (tests/test_export.py runs `convattn export`)"),
        (command == "glue" and not set(args.task.split(",")) <= FIXTURE_GLUE_TASKS,
         f"GLUE tasks beyond the fixture's {sorted(FIXTURE_GLUE_TASKS)}"),
    ]
    for reasons, kind in ((network, "network"), (costly, "costly")):
        for applies, reason in reasons:
            if applies:
                return Placement("parse", f"{kind}: {reason}", argv)
    return Placement("run", argv=tiny(command, argv, args))


def tiny(command: str, argv: list[str], args) -> list[str]:
    """`argv` at the tiny sizes: each of the command's TINY flags replaced where given, appended where not."""
    settings = dict(TINY.get(command, {}))
    if command == "compare" and args.glue:
        settings |= TINY_GLUE_IN_COMPARE
    if "--time-budget" in argv and "--warmup" in settings:  # a budget warms up over a fraction of itself
        settings["--warmup"] = "0.25"
    argv = list(argv)
    if "--max-steps" in settings and "--epochs" in argv:  # the two exclude each other
        at = argv.index("--epochs")
        del argv[at:at + 2]
    for flag, value in settings.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


PLACEMENTS = {}


def placement(command: Command) -> Placement:
    if command.id not in PLACEMENTS:
        PLACEMENTS[command.id] = place(command)
    return PLACEMENTS[command.id]


# --- the pages themselves ---------------------------------------------------------------------------------------

def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the rest belongs in docs/"


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {target.split("#")[0] for target in links(README)}
    missing = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in linked]
    assert not missing, f"README.md does not link {missing}"


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_somewhere(page):
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: link to {target}: no such file"
        if fragment and resolved.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", resolved.read_text(), flags=re.MULTILINE)
            assert fragment in {anchor(h) for h in headings}, f"{page.name}: link to {target}: no such heading"


@pytest.mark.parametrize("page", PAGES[1:], ids=lambda p: p.name)
def test_each_docs_page_says_first_what_it_covers(page):
    title, blank, first = page.read_text().splitlines()[:3]
    assert title.startswith("# ") and not blank and first.startswith("This page"), page.name


def test_every_block_has_a_known_language():
    unknown = [b.id for b in BLOCKS if b.lang not in SHELL | {"python"} | set(SHOWN_ONLY)]
    assert not unknown, f"blocks without a language this test places: {unknown} (label them: bash, python, text)"


def test_no_command_is_documented_twice():
    seen = {}
    for command in COMMANDS:
        key = " ".join(command.words)
        assert key not in seen, f"{command.id} repeats {seen[key]}: document it once and link there"
        seen[key] = command.id


def test_readme_test_command_is_ci_s():
    """README's test command is CI's first; its fast tier is the same command without the slow tests."""
    ci = [line.split() for line in (ROOT / ".ci" / "run").read_text().splitlines() if " -m pytest" in line]
    documented = [c.words for c in COMMANDS if c.block.page == "README.md" and c.words[1:3] == ["-m", "pytest"]]
    fast = [*ci[0], "-m", "not slow"]
    assert documented == [ci[0], fast], f"README's test commands {documented} are not CI's {ci[0]} and {fast}"


# --- shell commands ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.id)
def test_documented_command_is_placed_and_parses(command):
    """A convattn command parses (place() runs the CLI's parser); a launcher's own arguments parse with its
    parser; any other command is placed by a rule, or this fails."""
    where = placement(command)
    if command.words[0] == "torchrun":
        from torch.distributed.run import get_args_parser

        get_args_parser().parse_args(command.words[1:])
    elif command.words[0] == "accelerate":
        from accelerate.commands.launch import launch_command_parser

        launcher, _ = after_module(command.words, "convattn")
        parsed = launch_command_parser().parse_args([*launcher[2:-2], "-m", "convattn"])
        assert parsed.config_file is None or (ROOT / parsed.config_file).is_file(), parsed.config_file
    elif where.kind == "skip":
        for word in command.words[1:]:  # a script or file a skipped command names exists
            if re.fullmatch(r"benchmarks/[\w./]+", word):
                assert (ROOT / word).is_file(), f"{command.id}: no {word}"
        pytest.skip(where.reason)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder holding what the documents' commands name, and the tiny run `runs/pretrain-default`."""
    from convattn.cli import main

    ws = tmp_path_factory.mktemp("docs-workspace")
    (ws / "corpus").mkdir()
    write_corpus(ws / "corpus")
    (ws / "corpus" / "valid.txt").rename(ws / "valid.txt")
    shutil.copytree(GLUE_DATA, ws / "glue_data")
    for name in ("train-v1.1.json", "dev-v1.1.json", "train-v2.0.json", "dev-v2.0.json"):
        shutil.copy(SQUAD / name, ws / name)
    argv = tiny("pretrain", ["pretrain", "--train-file", "corpus/", "--eval-file", "valid.txt", "--output-dir",
                             "runs/pretrain-default"], None)
    with offline(tmp_path_factory, ws):
        assert main(argv) == 0
    return ws


@contextlib.contextmanager
def offline(tmp_path_factory, cwd: Path, env: dict[str, str] | None = None):
    """No hub, the session's convattn cache, one torch thread (tiny matrices; 2 shared cores), in `cwd`."""
    import torch

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        patch.setenv("CONVATTN_CACHE", str(tmp_path_factory.getbasetemp() / "convattn-cache"))
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        patch.chdir(cwd)
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


def scratch_copy(workspace: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(workspace, tmp_path / "ws", symlinks=True))


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.id)
@pytest.mark.slow
def test_documented_commands_run(block, workspace, tmp_path, tmp_path_factory, capsys):
    """The block's runnable commands, in order, in one scratch copy of the workspace, at the tiny sizes."""
    from convattn.cli import main

    commands = shell_commands(block)
    runnable = [(c, placement(c)) for c in commands if placement(c).kind == "run"]
    if not runnable:
        pytest.skip("; ".join(sorted({placement(c).reason for c in commands})))
    ws = scratch_copy(workspace, tmp_path)
    for command, where in runnable:
        with offline(tmp_path_factory, ws, command.env):
            code = main(where.argv)
        err = capsys.readouterr().err
        assert code == 0, f"{command.id}: exit {code} running `convattn {' '.join(where.argv)}`:\n{err[-3000:]}"


# --- Python blocks ----------------------------------------------------------------------------------------------

def python_rule(block: Block) -> tuple[str, str]:
    return next(((kind, reason) for pattern, kind, reason in PYTHON_RULES if pattern.search(block.code)),
                ("in-process", ""))


# warnings of other packages that a recipe cannot avoid: peft asks transformers' deprecated is_gradient_checkpointing
KNOWN_WARNINGS = ("`is_gradient_checkpointing` is deprecated",)


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.id)
@pytest.mark.slow
def test_python_block_runs(block, workspace, tmp_path, tmp_path_factory):
    kind, reason = python_rule(block)
    if kind == "skip":
        pytest.skip(reason)
    ws = scratch_copy(workspace, tmp_path)
    if kind == "without convattn":
        with offline(tmp_path_factory, ws, {"OMP_NUM_THREADS": "1"}):
            done = run_without_convattn(ws, block.code)
        assert done.returncode == 0, f"{block.id}:\n{done.stderr[-3000:]}"
        return
    with offline(tmp_path_factory, ws), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(block.code, block.id, "exec"), {"__name__": "__doc_block__"})
    # what a user running the recipe would see: no warning that asks nothing of them (issue 66: pin_memory on CPU)
    shown = [f"{w.category.__name__}: {w.message}" for w in caught
             if issubclass(w.category, UserWarning | FutureWarning)
             and not any(known in str(w.message) for known in KNOWN_WARNINGS)]
    assert not shown, f"{block.id}: {shown}"
