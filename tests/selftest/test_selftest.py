"""`npudist test`: the verdicts read from the ranks' records (recorded inputs), and real 2-rank runs that
pass on this machine and fail, by name, when a collective or the checkpoint round trip is broken."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from npudist.selftest.records import CHECKS, FAIL, NOT_RUN, PASS, SKIP, read_records, verdicts
from npudist.selftest.run import SelfTestOptions, launch_command, summary_line
from tests.conftest import child_env, run_npudist, run_py

HERE = Path(__file__).resolve().parent


def _ended(check: str, status: str = PASS, detail: str = "fine", seconds: float = 0.1) -> list[dict]:
    return [{"check": check, "event": "start"},
            {"check": check, "event": "end", "status": status, "detail": detail, "seconds": seconds}]


def _all(upto: int = len(CHECKS), **special: list[dict]) -> list[dict]:
    rows: list[dict] = []
    for check in CHECKS[:upto]:
        rows += special.get(check, _ended(check))
    return rows


def test_every_check_passed_by_every_rank_passes_with_the_slowest_ranks_time():
    records = {0: _all(), 1: _all(all_reduce=_ended("all_reduce", seconds=0.7))}
    got = verdicts(records, expected=2, finished=True)
    assert [v.check for v in got] == list(CHECKS) and all(v.status == PASS for v in got)
    assert got[1].seconds == 0.7


def test_a_check_one_rank_failed_fails_naming_the_rank_and_its_finding():
    bad = _ended("all_gather", FAIL, "gathered rows: 4096 of 8192 elements differ")
    got = verdicts({0: _all(), 1: _all(all_gather=bad)}, expected=2, finished=True)
    failed = [v for v in got if v.status == FAIL]
    assert [v.check for v in failed] == ["all_gather"]
    assert failed[0].detail == "rank 1: gathered rows: 4096 of 8192 elements differ"


def test_a_check_started_and_never_ended_is_named_as_hung_once_the_job_is_over():
    records = {0: _all(3), 1: [*_all(2), {"check": CHECKS[2], "event": "start"}]}
    assert [v.check for v in verdicts(records, expected=2, finished=False)] == list(CHECKS[:2])  # still running
    got = verdicts(records, expected=2, finished=True)
    assert got[2].status == FAIL and got[2].detail.startswith("rank 1 started it and never finished")
    assert {v.status for v in got[3:]} == {NOT_RUN} and len(got) == len(CHECKS)


def test_ranks_that_never_started_fail_the_process_group_check():
    got = verdicts({0: _ended(CHECKS[0])}, expected=2, finished=True)
    assert got[0].status == FAIL and "1 of 2 ranks never started" in got[0].detail


def test_a_skip_says_why_and_fails_nothing():
    skip = _ended("checkpoint", SKIP, "not on this node: pass --checkpoint-dir")
    got = verdicts({0: _all(), 1: _all(checkpoint=skip)}, expected=2, finished=True)
    assert got[-1].status == SKIP and got[-1].ok and "rank 1: not on this node" in got[-1].detail
    assert summary_line(got, 2, 3.0).startswith(f"npudist test: {len(CHECKS) - 1} checks passed and 1 skipped "
                                                "(checkpoint: why is above)")


def test_a_line_still_being_written_is_left_for_the_next_read(tmp_path):
    lines = [json.dumps(r) for r in _ended(CHECKS[0])]
    (tmp_path / "rank0.jsonl").write_text("\n".join(lines) + '\n{"check": "all_red')
    (tmp_path / "rankX.jsonl").write_text("not a rank file")
    assert read_records(tmp_path) == {0: _ended(CHECKS[0])}


def test_the_summary_names_the_failed_and_the_unrun_checks():
    rows = [*_all(4, all_gather=_ended("all_gather", FAIL, "x")), {"check": "reduce_scatter", "event": "start"}]
    got = verdicts({0: rows}, expected=1, finished=True)
    line = summary_line(got, 1, 9.0)
    assert "failed: all_gather, reduce_scatter" in line and "not run: all_reduce_many, ddp_step" in line


def test_several_hosts_pass_torchruns_options_and_the_shared_checkpoint_folder():
    cmd = launch_command(SelfTestOptions(launch_args=("--nnodes", "2", "--master-addr", "h0"), simulate="npu",
                                     checkpoint_dir=Path("/shared/t")), Path("/tmp/o"))
    tail = cmd[cmd.index("launch") + 1:]
    assert tail[:tail.index("-m")] == ["--simulate", "npu", "--nproc-per-node", "2", "--nnodes", "2",
                                       "--master-addr", "h0"]
    assert tail[-2:] == ["--checkpoint-dir", "/shared/t"]


@pytest.mark.ranks
@pytest.mark.slow
def test_npudist_test_passes_on_this_machine_within_30_seconds():
    began = time.monotonic()
    done = run_npudist(["test"], timeout=120)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for check in CHECKS:
        assert any(line.split()[:2] == [PASS, check] for line in lines), (check, done.stdout)
    assert lines[-1].startswith(f"npudist test: all {len(CHECKS)} checks passed on 2 ranks")
    assert took < 60, took  # 6-7 s alone on this 2-core machine; headroom for a loaded CI runner


CALL = ("import sys; from pathlib import Path; from npudist.selftest.run import SelfTestOptions, run_selftest; "
        "sys.exit(run_selftest(SelfTestOptions(rank_module='broken_rank', timeout_s=90, out=Path(sys.argv[1]))))")


@pytest.mark.ranks
@pytest.mark.slow
def test_a_broken_collective_and_a_broken_checkpoint_fail_by_name(tmp_path):
    env = child_env({"BROKEN": "all_gather,checkpoint"}, pythonpath=[HERE])
    done = run_py(["-c", CALL, str(tmp_path)], env=env, timeout=150)
    assert done.returncode == 1, done.stdout + done.stderr
    status = {line.split()[1]: line.split()[0] for line in done.stdout.splitlines()
              if line.startswith("  ") and not line.startswith("   ") and line.split()[1] in CHECKS}
    assert status == {**{c: PASS for c in CHECKS}, "all_gather": FAIL, "checkpoint": FAIL}, done.stdout
    assert "gathered rows" in done.stdout and "no good checkpoint there (skipping checkpoint" in done.stdout
    assert "fails its sha256 check" in done.stdout
    assert "failed: all_gather, checkpoint" in done.stdout.splitlines()[-2]
    assert (tmp_path / "launch.log").is_file()  # kept for the user on failure


@pytest.mark.ranks
@pytest.mark.slow
def test_npudist_test_passes_on_the_simulated_npu_without_torchs_timer_warning(tmp_path):
    """DDP's runtime stats have no timer for the `npu` device type: each rank printed torch's "Time stats are
    currently only collected for CPU and CUDA devices" (npudist.ddp leaves those stats out there)."""
    done = run_npudist(["test", "--simulate", "npu", "--out", str(tmp_path)], timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "over hccl on npu-sim" in done.stdout
    assert "Time stats are currently only collected" not in (tmp_path / "launch.log").read_text()
