"""benchmarks/cpu_cost.py's figures for the NaN sentinel (issue 44): its cost per step against npudist.ddp with it
off, and the scan's 1 % budget on the example's TinyLM."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_cost.py"


@pytest.fixture(scope="module")
def cpu_cost():
    spec = importlib.util.spec_from_file_location("cpu_cost_sentinel", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["cpu_cost_sentinel"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("cpu_cost_sentinel", None)


def test_the_sentinel_variants_are_measured_with_it_on_off_and_scanning(cpu_cost):
    by = cpu_cost.BY_NAME
    assert by["npudist_ddp"].sentinel == "loss"  # issue 42's budget is measured with the default sentinel on
    assert by["npudist_ddp_nosentinel"].sentinel == "off" and by["npudist_ddp_scan"].sentinel == "scan"
    assert by["lm_npudist_small_scan"].baseline == "lm_npudist_small"


def test_the_scan_budget_fails_past_one_percent_and_the_sentinels_cost_is_reported(cpu_cost):
    R = cpu_cost.Result
    runs = [R("ddp", dict.fromkeys(range(4), 1_000_000), 2, 0),
            R("npudist_ddp_nosentinel", dict.fromkeys(range(4), 990_000), 2, 0),
            R("npudist_ddp", dict.fromkeys(range(4), 1_000_000), 2, 0),
            R("lm_npudist_small", dict.fromkeys(range(4), 2_000_000), 5, 0),
            R("lm_npudist_small_scan", dict.fromkeys(range(4), 2_030_000), 5, 0)]
    checks = {what: (ok, figure) for what, ok, figure in cpu_cost.budgets(runs)}
    assert checks["NaN sentinel scan on the example's TinyLM: <= 1 % of its step"] == (False, "+1.50 %")
    assert checks["NaN sentinel (loss check, flag in the last bucket): added per step (reported)"] == (
        None, "+10.0 k = +1.000 % of plain DDP's step")
    runs[-1] = R("lm_npudist_small_scan", dict.fromkeys(range(4), 2_010_000), 5, 0)
    checks = {what: ok for what, ok, _ in cpu_cost.budgets(runs)}
    assert checks["NaN sentinel scan on the example's TinyLM: <= 1 % of its step"] is True
