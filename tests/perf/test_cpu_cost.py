"""benchmarks/cpu_cost.py: its reading of callgrind's dumps, its budgets, and that every variant still runs.

The counts themselves need valgrind and minutes, so they are the benchmark's to print (README), not a
test's; here the dry run checks that the variants build and that npudist.ddp keeps DDP's bucket layout.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import run_py

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "cpu_cost.py"
# The first lines of a real dump (callgrind 3.19, thread 1, the dump made after step 8).
HEAD = (Path(__file__).parent / "data" / "callgrind_step8_thread1.head").read_text()


@pytest.fixture(scope="module")
def cpu_cost():
    spec = importlib.util.spec_from_file_location("cpu_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["cpu_cost"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("cpu_cost", None)


def _dump(directory: Path, part: int, thread: int, step: int, total: int) -> None:
    text = HEAD.replace("part: 2", f"part: {part}").replace("thread: 1", f"thread: {thread}")
    text = text.replace("step8", f"step{step}").replace("17522906", str(total))
    (directory / f"cg.out.{part}-{thread:02d}").write_text(text + f"\nfn=(1) x\n1 5\ntotals: {total}\n")


def test_steps_are_read_from_the_main_threads_dumps_only(cpu_cost, tmp_path):
    for part, step, total in ((1, 7, 100), (2, 8, 130), (3, 9, 90)):
        _dump(tmp_path, part, 1, step, total)
        _dump(tmp_path, part, 2, step, 5_000_000)  # gloo's worker: not the training thread
    (tmp_path / "cg.out.4-01").write_text("# callgrind format\nversion: 1\n")  # cut short: ignored
    assert cpu_cost.main_thread_steps(tmp_path) == {7: 100, 8: 130, 9: 90}


def test_budgets_fail_past_the_issue_limits_and_name_the_figure(cpu_cost):
    """Issue 42's budget: npudist.ddp <= 1.005x plain DDP and <= 10 k instructions added per bucket."""
    R = cpu_cost.Result
    base = R("ddp", dict.fromkeys(range(8), 1_000_000), 2, 0)
    within = R("npudist_ddp", dict.fromkeys(range(8), 1_008_000), 2, 0)  # +4 k a bucket, 1.008x
    checks = {what: (ok, figure) for what, ok, figure in cpu_cost.budgets([base, within])}
    assert checks["npudist_ddp: <= 10 k added per bucket"] == (True, "+4.0 k x 2 buckets")
    assert checks["npudist_ddp: <= 1.005x ddp"] == (False, "1.0080x")
    over = R("npudist_ddp", dict.fromkeys(range(8), 1_030_000), 2, 0)
    checks = {what: ok for what, ok, _ in cpu_cost.budgets([base, over])}
    assert checks["npudist_ddp: <= 10 k added per bucket"] is False


def test_periodic_steps_are_those_over_the_median(cpu_cost):
    steps = {80: 1_500_000, **{s: 1_000_000 + s for s in range(81, 100)}, 100: 2_000_000}
    r = cpu_cost.Result("timer", steps, 2, 0)
    assert set(r.periodic()) == {80, 100}
    assert r.periodic()[100] == 2_000_000 - round(r.typical)


@pytest.mark.subprocess
def test_every_variant_runs_and_npudist_ddp_keeps_ddps_buckets():
    proc = run_py([str(SCRIPT), "--dry-run", "--jobs", "2", "--only", "ddp,npudist_ddp,ddp_w2,npudist_ddp_w2"],
                  timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    buckets = dict(re.findall(r"^(\w+): [\d,]+ instructions per step \((\d+) buckets\)", proc.stdout, re.M))
    assert set(buckets) == {"ddp", "npudist_ddp", "ddp_w2", "npudist_ddp_w2"}
    assert buckets["ddp"] == buckets["npudist_ddp"] == buckets["ddp_w2"] == buckets["npudist_ddp_w2"] == "2"
