import math
import sys

from prometheus_client import CollectorRegistry, generate_latest

from npudist.comm.recorder import CommStats, OpStats
from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.job.allocator import AllocatorCollector, fragmentation
from npudist.telemetry.job.comm_metrics import CommCollector, histogram_buckets
from tests.telemetry.exp_helpers import families, samples

RANK = ["1", "1", "n1", "5", "0", "r1"]
KEY = (("chip", "0"), ("device", "5"), ("local_rank", "1"), ("node", "n1"), ("rank", "1"), ("run", "r1"))


def _text(*collectors) -> dict:
    reg = CollectorRegistry(auto_describe=False)
    for c in collectors:
        reg.register(c)
    return families(generate_latest(reg).decode())


def test_allocator_values_and_fragmentation():
    health = CollectorHealth()
    stats = {"allocated_bytes": 3 << 30, "reserved_bytes": 4 << 30}
    fams = _text(AllocatorCollector(lambda: stats, health, RANK))
    assert samples(fams, "npudist_allocator_allocated_bytes") == {KEY: 3 * 2**30}
    assert samples(fams, "npudist_allocator_reserved_bytes") == {KEY: 4 * 2**30}
    assert samples(fams, "npudist_allocator_fragmentation_ratio") == {KEY: 0.25}  # 1 - 3/4


def test_allocator_with_nothing_reserved_has_no_ratio_and_cpu_has_no_samples():
    stats = {"allocated_bytes": 0, "reserved_bytes": 0}
    fams = _text(AllocatorCollector(lambda: stats, CollectorHealth(), RANK))
    assert samples(fams, "npudist_allocator_reserved_bytes") == {KEY: 0.0}
    assert samples(fams, "npudist_allocator_fragmentation_ratio") == {}
    fams = _text(AllocatorCollector(dict, CollectorHealth(), RANK))
    assert samples(fams, "npudist_allocator_allocated_bytes") == {}
    assert fragmentation(5, 0) is None and fragmentation(1, 4) == 0.75


def test_allocator_failure_is_counted_not_raised():
    health = CollectorHealth()

    def broken():
        raise RuntimeError("device lost")

    fams = _text(AllocatorCollector(broken, health, RANK))
    assert samples(fams, "npudist_allocator_allocated_bytes") == {}
    assert health.errors("allocator") == {"error": 1}


# Snapshots shaped as npudist.comm.stats() returns them, with values written by hand.
INF = float("inf")


ALL_REDUCE = OpStats("all_reduce", "gloo", 200, 200 * 4096, 0.06, 200,
                     ((1e-4, 10), (5e-4, 150), (1e-3, 195), (INF, 200)), 2, {"cast": 3, "stage": 200})


def test_comm_collector_exports_the_snapshot():
    fams = _text(CommCollector(CollectorHealth(), RANK, stats=lambda: CommStats((ALL_REDUCE,))))
    key = tuple(sorted((*KEY, ("op", "all_reduce"), ("backend", "gloo"))))
    key = tuple(sorted(key))
    assert samples(fams, "npudist_collective_calls", "npudist_collective_calls_total") == {key: 200.0}
    assert samples(fams, "npudist_collective_bytes", "npudist_collective_bytes_total") == {key: 819200.0}
    assert samples(fams, "npudist_collective_inflight") == {key: 2.0}
    h = fams["npudist_collective_duration_seconds"]
    buckets = {s.labels["le"]: s.value for s in h.samples if s.name.endswith("_bucket")}
    assert buckets == {"0.0001": 10.0, "0.0005": 150.0, "0.001": 195.0, "+Inf": 200.0}
    assert [s.value for s in h.samples if s.name.endswith("_count")] == [200.0]
    assert [s.value for s in h.samples if s.name.endswith("_sum")] == [0.06]
    kinds = {dict(k)["kind"]: v for k, v in samples(fams, "npudist_collective_adaptations",
                                                     "npudist_collective_adaptations_total").items()}
    assert kinds == {"cast": 3.0, "stage": 200.0}


def test_comm_collector_skips_malformed_ops_and_counts_them():
    health = CollectorHealth()
    not_cumulative = OpStats("broadcast", "gloo", 2, 8, 0.1, 2, ((0.1, 2), (INF, 1)), 0, {})
    no_inf = OpStats("barrier", "gloo", 1, 0, 0.1, 1, ((0.1, 1),), 0, {})
    fams = _text(CommCollector(health, RANK, stats=lambda: CommStats((not_cumulative, ALL_REDUCE, no_inf))))
    ops = {dict(k)["op"] for k in samples(fams, "npudist_collective_calls", "npudist_collective_calls_total")}
    assert ops == {"all_reduce"}
    assert health.errors("comm") == {"parse": 2}


def test_comm_collector_without_npudist_comm_yields_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "npudist.comm", None)  # import of npudist.comm now fails
    fams = _text(CommCollector(CollectorHealth(), RANK))
    assert not any(name.startswith("npudist_collective") for name in fams)


def test_histogram_buckets_rejects_bad_shapes():
    assert histogram_buckets(((0.5, 1), (INF, 1))) == [("0.5", 1.0), ("+Inf", 1.0)]
    for bad in ((), ((1.0, 1),), ((1.0, 3), (0.5, 4), (INF, 4))):
        try:
            histogram_buckets(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} accepted")
    assert math.isinf(INF)


def test_training_progress_exports_loss_and_throughput_once_reported():
    import pytest as _pytest

    from npudist.telemetry.job.progress import ProgressMetrics

    prog = ProgressMetrics(["0", "0", "n", "", "", ""])
    assert [f.samples for f in prog.collect()] == [[], [], []]  # nothing until the loop reports
    prog.report(loss=2.5, samples_per_second=812.0)
    got = {f.name: f.samples[0].value for f in prog.collect() if f.samples}
    assert got == {"npudist_training_loss": 2.5, "npudist_training_samples_per_second": 812.0}
    with _pytest.raises(ValueError, match="not a finite number"):
        prog.report(loss=float("nan"))


def test_logged_scalars_are_exported_by_name_and_bounded(caplog):
    from npudist.telemetry.job.progress import MAX_SCALARS, ProgressMetrics

    prog = ProgressMetrics(["0", "0", "n", "", "", ""])
    prog.report_scalars({"lr": 3e-4, "grad_norm": float("nan")})  # non-finite: no sample, not an error
    prog.report_scalars({"lr": 1e-4, "grad_norm": 2.0})
    (fam,) = [f for f in prog.collect() if f.name == "npudist_training_scalar"]
    assert {s.labels["name"]: s.value for s in fam.samples} == {"lr": 1e-4, "grad_norm": 2.0}
    assert fam.samples[0].labels["rank"] == "0"
    prog.report_scalars({f"x{i}": 1.0 for i in range(2 * MAX_SCALARS)})  # a name per step must not grow series
    (fam,) = [f for f in prog.collect() if f.name == "npudist_training_scalar"]
    assert len(fam.samples) == MAX_SCALARS
    assert "not exported" in caplog.text
