"""nn.SyncBatchNorm across 2 ranks of the simulated NPU (its batch-norm kernels: npudist/sim/batch_norm.py),
against BatchNorm2d over the whole global batch in one process."""

from __future__ import annotations

import json

import pytest

from npudist.runtime import compat
from tests.conftest import child_env, run_npudist

pytestmark = [pytest.mark.slow, pytest.mark.ranks, pytest.mark.timeout(600),
              pytest.mark.skipif(not compat.simulation_available(), reason="the simulated NPU needs torch >= 2.10")]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[int, dict]:
    out = tmp_path_factory.mktemp("sync-bn")
    proc = run_npudist(["launch", "--simulate", "npu", "--nproc-per-node", "2", "tests/sim/sync_batch_norm_job.py",
                        str(out)], env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return {r["rank"]: r for r in found}


def test_sync_batch_norm_equals_batch_norm_over_the_global_batch(ranks):
    assert sorted(ranks) == [0, 1]
    for r in ranks.values():
        assert r["device"].startswith("npu")
        tol = 1e-5 * max(1.0, r["scale"])  # float32 rounding of sums in another order, nothing more
        for what in ("output", "input_grad", "running_mean", "running_var", "weight_grad", "bias_grad"):
            assert r[what] <= tol, (r["rank"], what, r[what])


def test_a_converted_net_trains_under_ddp_with_one_set_of_running_statistics(ranks):
    for r in ranks.values():
        assert r["bn_type"] == "SyncBatchNorm" and r["batches_tracked"] == 6
    total = [sum(step) for step in zip(*(r["losses"] for r in ranks.values()), strict=True)]
    assert total[-1] < 0.97 * total[0], total  # the job's loss (each rank's alone may rise: DDP averages)
    for r in ranks.values():  # every rank normalised with the global batch's statistics: one running estimate
        assert r["running_stats_differ"] <= 1e-6, r["running_stats_differ"]
