"""A finished 2-rank job exits 0, every time (issue 46): the exit-time abort's shape, run a few times here.

benchmarks/clean_exit.py runs finished jobs whose last all_reduce completes while rank 0 leaves (the
shape of ``terminate called without an active exception``: comm/quiesce.py). The issue's 50 runs take
minutes on a 2-core host, so they live in the benchmark (``python benchmarks/clean_exit.py --jobs 50``,
figures in docs/engineering/benchmarks.md); this test runs the same jobs JOBS times.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_py

JOBS = 8


@pytest.mark.slow
@pytest.mark.ranks
def test_finished_two_rank_jobs_exit_zero_every_time():
    r = run_py([str(REPO / "benchmarks" / "clean_exit.py"), "--jobs", str(JOBS), "--seed", "7"], timeout=240)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, r.stdout[-2000:] + r.stderr[-3000:]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["jobs"] == JOBS
    assert result["failed"] == [], r.stderr[-3000:]
    assert r.returncode == 0
