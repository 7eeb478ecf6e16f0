import time

import pytest

from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.node_exporter import build
from npudist.telemetry.sources.poller import Poller
from tests.telemetry.exp_helpers import (
    CRASH,
    GARBAGE,
    GIB,
    ScriptedSource,
    eight_ascend,
    families,
    registry_text,
    samples,
)


def _labels(device: int) -> tuple:
    return (("chip", "0"), ("device", str(device)), ("model", "910B3"), ("node", "n1"), ("vendor", "npu"))


def test_good_read_is_exported_in_base_units():
    ex = build([ScriptedSource([eight_ascend()])], interval_s=1.0, node="n1")
    assert ex.pollers[0].poll_once()
    fams = families(registry_text(ex.registry))
    # Values written from eight_ascend()'s definition: device i draws 90+i W at 40+i C.
    assert samples(fams, "npudist_device_power_watts")[_labels(3)] == 93.0
    assert samples(fams, "npudist_device_temperature_celsius")[_labels(7)] == 47.0
    assert samples(fams, "npudist_device_utilization_ratio")[_labels(5)] == 0.5
    assert samples(fams, "npudist_device_memory_total_bytes")[_labels(0)] == 64 * GIB
    assert len(samples(fams, "npudist_device_up")) == 8
    assert set(samples(fams, "npudist_device_up").values()) == {1.0}
    # frequency is None for every chip: no sample at all, never a 0
    assert samples(fams, "npudist_device_frequency_hertz") == {}
    info = {dict(k)["device"]: dict(k) for k in samples(fams, "npudist_device_info")}
    assert info["2"]["bus_id"] == "0000:C2:00.0" and info["2"]["health"] == "OK"
    assert info["2"]["logical_id"] == "2"
    assert samples(fams, "npudist_collector_last_success_timestamp_seconds")[(("collector", "fake"),)] > 0


@pytest.mark.parametrize(("failure", "reason"), [(GARBAGE, "parse"), (CRASH, "exit_code"),
                                                 (RuntimeError("boom"), "error"), ("not a list", "error")])
def test_failures_are_counted_and_the_last_good_snapshot_served(failure, reason):
    ex = build([ScriptedSource([eight_ascend(), failure])], interval_s=1.0, node="n1")
    poller = ex.pollers[0]
    assert poller.poll_once()
    assert not poller.poll_once()
    assert not poller.poll_once()
    fams = families(registry_text(ex.registry))
    errors = samples(fams, "npudist_collector_errors", "npudist_collector_errors_total")
    assert errors == {(("collector", "fake"), ("reason", reason)): 2.0}
    assert samples(fams, "npudist_device_power_watts")[_labels(1)] == 91.0  # last good value kept
    assert set(samples(fams, "npudist_device_up").values()) == {0.0}  # but the device is reported down


def test_a_hung_source_times_out_and_never_blocks_a_scrape():
    source = ScriptedSource([eight_ascend(), "hang"])
    ex = build([source], interval_s=0.05, node="n1", timeout_s=0.2)
    poller = ex.pollers[0]
    try:
        assert poller.poll_once()
        began = time.monotonic()
        assert not poller.poll_once()  # waits its 0.2 s timeout, then gives up
        assert 0.15 < time.monotonic() - began < 2.0
        began = time.monotonic()
        text = registry_text(ex.registry)
        assert time.monotonic() - began < 0.1
        assert not poller.poll_once()  # still stuck: counted again, no second read started
        assert source.calls == 2
        assert ex.health.errors("fake") == {"timeout": 2}
        fams = families(text)
        assert samples(fams, "npudist_device_power_watts")[_labels(0)] == 90.0
        assert set(samples(fams, "npudist_device_up").values()) == {0.0}
    finally:
        source.release.set()


def test_background_thread_recovers_after_a_hang():
    source = ScriptedSource(["hang", eight_ascend()])
    poller = Poller(source, CollectorHealth(), interval_s=0.05, timeout_s=0.1).start()
    try:
        time.sleep(0.35)
        assert poller.snapshot().readings == ()
        assert poller.health.errors("fake")["timeout"] >= 2
        source.release.set()  # the stuck read returns late (discarded); the next read succeeds
        deadline = time.monotonic() + 5
        while not poller.snapshot().fresh and time.monotonic() < deadline:
            time.sleep(0.02)
        assert poller.snapshot().fresh and len(poller.snapshot().readings) == 8
    finally:
        source.release.set()
        poller.stop()


def test_stale_snapshot_is_reported_down():
    poller = Poller(ScriptedSource([eight_ascend()]), CollectorHealth(), interval_s=1.0, stale_after_s=0.0)
    poller.poll_once()
    time.sleep(0.01)
    snap = poller.snapshot()
    assert not snap.fresh and len(snap.readings) == 8


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval must be positive"):
        Poller(ScriptedSource([[]]), CollectorHealth(), interval_s=0)
