"""How OpenMP's idle threads wait (convattn.openmp): sleeping where a time budget's compute clock counts, a short
spin everywhere else, the user's own setting kept; chosen before anything loads torch."""

from __future__ import annotations

import json
import os

import pytest

from convattn import cli, openmp


@pytest.fixture
def unset(monkeypatch):
    """Neither variable set, and whatever a test sets removed after it (setenv records the state to restore)."""
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


@pytest.mark.parametrize(("argv", "counts"), [
    (["pretrain", "--time-budget", "10m"], True),
    (["pretrain", "--time-budget=10m", "--budget-clock", "compute"], True),
    (["compare", "--presets", "chang2021-small/none", "--time-budget", "90s"], True),
    (["pretrain", "--time-b", "10m"], True),  # argparse takes a unique prefix
    (["pretrain", "--time-budget", "10m", "--budget-clock", "wall"], False),
    (["pretrain", "--time-budget", "10m", "--budget-clock=wall"], False),
    (["pretrain", "--max-steps", "100"], False),
    (["compare", "--grid", "positions", "--max-steps", "1500"], False),
    (["glue", "--model", "m", "--task", "sst2"], False),
    (["presets"], False),
    ([], False),
    (["pretrain", "--resume"], True),  # no folder named: unsure
])
def test_the_compute_clock_is_read_from_the_arguments(argv, counts):
    assert openmp.counts_compute(argv) is counts


def test_a_resumed_run_keeps_the_clock_its_options_recorded(tmp_path):
    def options(run: str, **recorded) -> str:
        (tmp_path / run).mkdir()
        (tmp_path / run / "pretrain_options.json").write_text(json.dumps(recorded))
        return str(tmp_path / run)

    compute = options("compute", time_budget=60.0, max_steps=None, budget_clock="compute")
    wall = options("wall", time_budget=60.0, max_steps=None, budget_clock="wall")
    legacy = options("legacy", time_budget=60.0, max_steps=None)  # before the choice: the wall's time
    steps = options("steps", time_budget=None, max_steps=500, budget_clock="compute")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "pretrain_options.json").write_text("{not json")
    for folder, counts in ((compute, True), (wall, False), (legacy, False), (steps, False),
                           (str(tmp_path / "damaged"), True), (str(tmp_path / "absent"), True)):
        assert openmp.counts_compute(["pretrain", "--resume", "--output-dir", folder]) is counts, folder
        assert openmp.counts_compute(["pretrain", f"--output-dir={folder}", "--resume"]) is counts, folder
    # a clock on the command line speaks for itself
    assert openmp.counts_compute(["pretrain", "--resume", "--output-dir", compute, "--budget-clock", "wall"]) is False


def test_threads_sleep_under_a_compute_clock_and_spin_briefly_elsewhere(unset):
    openmp.choose_waiting(["pretrain", "--time-budget", "1h"])
    assert os.environ.get("OMP_WAIT_POLICY") == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ
    del os.environ["OMP_WAIT_POLICY"]
    openmp.choose_waiting(["pretrain", "--max-steps", "10"])
    assert os.environ.get("GOMP_SPINCOUNT") == "1000" and "OMP_WAIT_POLICY" not in os.environ


@pytest.mark.parametrize("users", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"},
                                   {"OMP_WAIT_POLICY": "PASSIVE"}])
def test_the_users_own_setting_is_kept(unset, monkeypatch, users):
    for name, value in users.items():
        monkeypatch.setenv(name, value)
    for argv in (["pretrain", "--time-budget", "1h"], ["glue"]):
        openmp.choose_waiting(argv)
        assert {name: os.environ.get(name) for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} == {
            "OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None, **users}


def test_the_command_line_chooses_before_parsing_which_may_load_torch(unset, monkeypatch):
    """--time-budget's parser imports the budget module, and torch with it: OpenMP reads the variables then."""
    seen = []

    def parser():
        seen.append((os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")))
        raise SystemExit(0)
    monkeypatch.setattr(cli, "build_parser", parser)
    for argv in (["pretrain", "--time-budget", "5m"], ["presets"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
            os.environ.pop(name, None)
    assert seen == [("PASSIVE", None), (None, "1000")]


def test_choosing_loads_neither_torch_nor_a_run_folder_module_that_does(tmp_path):
    """The command line starts without torch: choosing (a resumed run's options read) must not load it."""
    import subprocess
    import sys

    script = ("import sys; sys.argv = ['convattn']\n"
              "from convattn import openmp\n"
              f"openmp.counts_compute(['pretrain', '--resume', '--output-dir', {str(tmp_path)!r}])\n"
              "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize(("variables", "sleep"), [
    ({}, False),  # libgomp's default: spin 300,000 rounds
    ({"OMP_WAIT_POLICY": "PASSIVE"}, True),
    ({"OMP_WAIT_POLICY": "passive"}, True),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, False),
    ({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"}, False),  # the count overrides the policy
    ({"GOMP_SPINCOUNT": "0"}, True),
    ({"GOMP_SPINCOUNT": "1000"}, False),
])
def test_a_compute_clock_on_spinning_threads_is_warned_of_on_cpu_only(unset, monkeypatch, variables, sleep):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert openmp.threads_sleep() is sleep
    warning = openmp.compute_clock_warning("cpu")
    assert (warning is None) is sleep
    if warning:
        assert "OMP_WAIT_POLICY=PASSIVE" in warning
    assert openmp.compute_clock_warning("cuda") is None  # a GPU's clock is its own time
