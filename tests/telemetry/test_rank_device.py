"""Rank -> physical NPU: `npu-smi info -m` plus ASCEND_RT_VISIBLE_DEVICES name the card and chip a rank uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.rank_exporter import LOCATE, locate, rank_labels
from npudist.telemetry.sources.npu_smi import NpuSmiSource, VisibleDevicesError, parse_mapping, rank_chip
from npudist.telemetry.sources.readings import RankDevice

RECORDINGS = Path(__file__).resolve().parents[1] / "fakes" / "npu-smi"
TWO_910B3 = parse_mapping((RECORDINGS / "info-m-mapping.txt").read_text())  # NPU 3 -> logical 0, NPU 4 -> 1
A3 = parse_mapping((RECORDINGS / "info-m-a3-16chip-constructed.txt").read_text())  # NPU n chip c -> 2n + c


def _where(mapping, visible, index):
    d = rank_chip(mapping, visible, index)
    return d.device_id, d.chip_id, d.logical_id


def test_unset_means_every_chip_in_logical_order():
    # NPU IDs are labels: on this recorded 910B3 node, npu:0 is NPU 3 and npu:1 is NPU 4.
    assert _where(TWO_910B3, None, 0) == (3, 0, 0)
    assert _where(TWO_910B3, None, 1) == (4, 0, 1)
    assert _where(A3, None, 5) == (2, 1, 5)


@pytest.mark.parametrize(("visible", "index", "expected"), [
    ("1", 0, (4, 0, 1)),  # the only visible chip is logical 1: npu:0 is NPU 4
    ("0,1", 1, (4, 0, 1)),
    ("4,5", 0, (2, 0, 4)),  # the example: local rank 0 is logical 4
    ("4,5", 1, (2, 1, 5)),  # ... and local rank 1 the second chip of the same card
    ("3,8,15", 2, (7, 1, 15)),
])
def test_visible_devices_remap_the_index(visible, index, expected):
    mapping = TWO_910B3 if visible in ("1", "0,1") else A3
    assert _where(mapping, visible, index) == expected


@pytest.mark.parametrize(("visible", "index", "message"), [
    ("1, 2", 0, r"entry 2 \(' 2'\) is not a logical device ID .* sees 1\. Write it like"),
    ("0;1", 0, r"entry 1 \('0;1'\) is not a logical device ID .* sees no device"),
    ("", 0, r"entry 1 \(''\) is not a logical device ID"),
    ("npu0", 0, r"is not a logical device ID"),
    ("0,٣", 0, r"entry 2 \('٣'\) is not a logical device ID"),  # a non-ASCII digit
    ("9" * 400, 0, r"is not a logical device ID"),
    ("0,1,16", 0, r"logical ID 16 is not a chip of this node \(`npu-smi info -m` lists 0,1,.*,15\); .* sees 0,1"),
    ("5,4", 0, r"ascending without repeats .* write 4,5"),
    ("4,4", 0, r"ascending without repeats"),
    ("4,5", 2, r"device index 2 is past the 2 chip\(s\) ASCEND_RT_VISIBLE_DEVICES='4,5' makes visible"),
    (None, 16, r"device index 16 is not a chip of this node"),
    (None, -1, r"negative"),
])
def test_bad_visible_devices_are_refused_with_what_the_runtime_would_see(visible, index, message):
    with pytest.raises(VisibleDevicesError, match=message):
        rank_chip(A3, visible, index)


@pytest.mark.subprocess
def test_source_locates_through_info_m(fake_path, monkeypatch):
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_MAP", str(RECORDINGS / "info-m-a3-16chip-constructed.txt"))
    assert NpuSmiSource().locate({"ASCEND_RT_VISIBLE_DEVICES": "4,5"}, 1) == RankDevice(2, 1, 5)
    assert fake_path.read_text().splitlines() == ["info -m"]


@pytest.mark.subprocess
def test_read_fills_logical_ids_and_asks_info_m_once(fake_path, monkeypatch):
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_FILE", str(RECORDINGS / "910b2c-8npu-constructed.txt"))
    src = NpuSmiSource()
    for _ in range(3):
        by_id = {r.device_id: r.logical_id for r in src.read()}
    assert by_id[3] == 0 and by_id[4] == 1 and by_id[0] is None  # the 910B table itself has no logical column
    assert fake_path.read_text().splitlines() == ["info", "info -m", "info", "info"]


@pytest.mark.subprocess
def test_a_failing_info_m_is_retried_only_every_n_reads(fake_path, monkeypatch, tmp_path):
    from npudist.telemetry.sources.npu_smi import source

    monkeypatch.setattr(source, "MAPPING_RETRY_READS", 2)
    monkeypatch.setenv("NPUDIST_FAKE_NPU_SMI_MAP", str(tmp_path / "missing-info-m.txt"))  # the fake then fails
    src = NpuSmiSource()
    for _ in range(4):
        assert {r.logical_id for r in src.read()} == {None}
    assert fake_path.read_text().splitlines() == ["info", "info -m", "info", "info", "info", "info -m"]


class _Source:
    def __init__(self, result):
        self.result = result

    def locate(self, env, index):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_a_failed_lookup_is_counted_and_leaves_the_labels_empty(caplog):
    from npudist.telemetry.sources.readings import SourceError

    health = CollectorHealth()
    assert locate(_Source(SourceError("timeout", "npu-smi hung")), {}, 0, health) is None
    assert locate(_Source(VisibleDevicesError("ASCEND_RT_VISIBLE_DEVICES='x': bad")), {}, 0, health) is None
    assert health.errors(LOCATE) == {"timeout": 1, "config": 1}
    assert "ASCEND_RT_VISIBLE_DEVICES='x'" in caplog.text
    assert rank_labels(3, 1, "n1", None) == ["3", "1", "n1", "", "", ""]
    assert rank_labels(3, 1, "n1", RankDevice(2, 1, 5), "j7") == ["3", "1", "n1", "2", "1", "j7"]


def test_the_hosts_one_cpu_reading_is_every_cpu_ranks():
    """Rank 1 of a CPU job found no reading of its own: its straggler line said "frequency n/a" and its run log
    had no CPU utilization, although the host source reads the clock for every rank on the host."""
    from npudist.telemetry.exposition.rank_exporter import local_reading
    from npudist.telemetry.sources.readings import DeviceReading

    host = DeviceReading(vendor="cpu", device_id=0, frequency_hertz=2.6e9, utilization_ratio=0.5)
    assert [local_reading((host,), r) for r in (0, 1, 7)] == [host, host, host]
    gpus = (DeviceReading(vendor="cuda", device_id=0), DeviceReading(vendor="cuda", device_id=1))
    assert local_reading(gpus, 1) is gpus[1] and local_reading(gpus[:1], 1) is None  # a device per rank
