"""`npudist launch --simulate` and NPUDIST_SIMULATE: what the ranks are given, without starting them."""

from __future__ import annotations

from pathlib import Path

import pytest

from npudist.accelerators import BY_NAME, Accelerator
from npudist.launch import LaunchError, plan
from npudist.runtime.settings import Settings, SettingsError

CPU = Accelerator(BY_NAME["cpu"])
STAND_IN = Path(__file__).resolve().parents[2] / "src" / "npudist" / "sim" / "stand_in"


def test_simulate_gives_the_ranks_the_mode_and_the_stand_in_first_on_the_path():
    p = plan(["--simulate", "npu", "train.py"], CPU, {"PYTHONPATH": "/mine"})
    assert p.env_updates["NPUDIST_SIMULATE"] == "npu"
    assert p.env_updates["PYTHONPATH"].split(":") == [str(STAND_IN), "/mine"]
    assert "NPUDIST_COMM_PROFILE" not in p.env_updates
    assert p.nproc_per_node == 2  # the npu-sim row's default, whatever this host has
    assert "--simulate" not in p.torchrun_argv


def test_strict_also_sets_the_strict_profile_unless_one_is_given():
    assert plan(["--simulate", "npu:strict", "t.py"], CPU, {}).env_updates["NPUDIST_COMM_PROFILE"] == "hccl-strict"
    given = plan(["--simulate", "npu:strict", "t.py"], CPU, {"NPUDIST_COMM_PROFILE": "hccl"})
    assert "NPUDIST_COMM_PROFILE" not in given.env_updates


def test_without_simulate_nothing_is_added():
    p = plan(["--nproc-per-node", "2", "t.py"], CPU, {})
    assert "NPUDIST_SIMULATE" not in p.env_updates and "PYTHONPATH" not in p.env_updates


def test_unknown_modes_are_refused():
    with pytest.raises(LaunchError, match="choose one of npu, npu:strict"):
        plan(["--simulate", "cuda", "t.py"], CPU, {})
    with pytest.raises(SettingsError, match="NPUDIST_SIMULATE='gpu'"):
        Settings.from_env({"NPUDIST_SIMULATE": "gpu"})


def test_simulating_forces_the_simulated_row():
    assert Settings.from_env({"NPUDIST_SIMULATE": "NPU:strict"}).forced_accelerator == "npu-sim"
    assert Settings.from_env({"NPUDIST_ACCELERATOR": "cpu"}).forced_accelerator == "cpu"
    assert "npu-sim" not in [v.name for v in __import__("npudist.accelerators").accelerators.VENDORS]
