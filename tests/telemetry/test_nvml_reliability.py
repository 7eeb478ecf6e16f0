"""NVIDIA reliability families against tests/fakes/pynvml.py: ECC (volatile/aggregate x corrected/uncorrected),
retired pages, remapped rows, XID events and clock-throttle reasons; unsupported calls have no sample."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.node_exporter import collectors
from npudist.telemetry.exposition.reliability_metrics import ReliabilityCollector
from npudist.telemetry.exposition.selection import parse_selection
from npudist.telemetry.sources.measurements import ChipMeasurements
from npudist.telemetry.sources.nvml_reliability import NvmlReliabilitySource
from npudist.telemetry.sources.poller import Poller
from npudist.telemetry.sources.readings import SourceError
from tests.conftest import FAKES


@pytest.fixture
def fake_nvml(monkeypatch):
    spec = importlib.util.spec_from_file_location("fake_pynvml_rel", FAKES / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fake_pynvml_rel", module)
    spec.loader.exec_module(module)
    return module


def _values(src: NvmlReliabilitySource) -> dict[tuple, float]:
    return {(c.device_id, x.metric.removeprefix("npudist_device_"), *(v for _, v in x.labels)): x.value
            for c in src.read() for x in c.measurements}


def test_ecc_pages_rows_and_throttle_reasons(fake_nvml):
    fake_nvml.GPUS = [fake_nvml.FakeGpu()]
    got = _values(NvmlReliabilitySource(fake_nvml))
    assert got[(0, "ecc_corrected_errors_total", "device")] == 3
    assert got[(0, "ecc_aggregate_corrected_errors_total", "device")] == 120
    assert got[(0, "ecc_aggregate_uncorrected_errors_total", "device")] == 1
    assert got[(0, "memory_retired_pages", "device", "single_bit")] == 2  # two page addresses listed
    assert got[(0, "memory_retired_pages", "device", "double_bit")] == 1
    assert got[(0, "memory_remapped_rows", "uncorrectable")] == 1
    assert (got[(0, "memory_remap_pending")], got[(0, "memory_remap_failed")]) == (1, 0)
    assert got[(0, "clock_throttle_active", "sw_power_cap")] == 1  # mask 0x4 | 0x40
    assert got[(0, "clock_throttle_active", "hw_thermal_slowdown")] == 1
    assert got[(0, "clock_throttle_active", "gpu_idle")] == 0


def test_xid_events_accumulate_per_gpu_and_code(fake_nvml):
    fake_nvml.GPUS = [fake_nvml.FakeGpu(), fake_nvml.FakeGpu()]
    src = NvmlReliabilitySource(fake_nvml)
    fake_nvml.XID_EVENTS[:] = [(1, 79), (1, 79), (0, 48)]
    got = _values(src)
    assert (got[(1, "xid_errors_total", "79")], got[(0, "xid_errors_total", "48")]) == (2, 1)
    fake_nvml.XID_EVENTS[:] = [(1, 79)]
    assert _values(src)[(1, "xid_errors_total", "79")] == 3  # a counter: earlier events stay counted


def test_unsupported_calls_have_no_sample_and_no_driver_is_missing(fake_nvml):
    fake_nvml.GPUS = [fake_nvml.FakeGpu(ecc=None, remapped_rows=None, throttle_mask=None)]
    got = _values(NvmlReliabilitySource(fake_nvml))
    assert not any(k[1].startswith(("ecc_", "memory_remap", "clock_")) for k in got)
    assert got[(0, "memory_retired_pages", "device", "single_bit")] == 2
    fake_nvml.INIT_ERROR = fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(SourceError) as err:
        NvmlReliabilitySource(fake_nvml).read()
    assert err.value.reason == "missing"


def test_served_on_by_default_and_switchable(fake_nvml):
    fake_nvml.GPUS = [fake_nvml.FakeGpu()]
    assert NvmlReliabilitySource(fake_nvml).collectors == ["nvml_ecc", "nvml_pages", "nvml_xid", "nvml_throttle"]
    selection = parse_selection("all,-nvml_throttle", collectors())
    src = NvmlReliabilitySource(fake_nvml, selection=selection)
    health = CollectorHealth()
    poller = Poller(src, health, interval_s=60, record=ChipMeasurements)
    assert poller.poll_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReliabilityCollector([poller], health, selection, node="g1"))
    names = {s.name for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}
    assert "npudist_device_ecc_uncorrected_errors_total" in names
    assert not any("throttle" in n for n in names)


def test_every_family_of_one_gpu_carries_the_same_model_and_no_empty_health(fake_nvml):
    """A PromQL join on ``model`` must keep the ECC, remapped-rows and throttle series (issue 33: they had
    model="" beside the device series' model="NVIDIA H200"), and NVML reports no health verdict."""
    from npudist.telemetry.exposition.node_exporter import build
    from npudist.telemetry.sources.nvml import NvmlSource

    fake_nvml.GPUS = [fake_nvml.FakeGpu(name="NVIDIA H200"), fake_nvml.FakeGpu(name="NVIDIA A100-SXM4-80GB")]
    selection = parse_selection("all", collectors())
    exporter = build([NvmlSource(fake_nvml)], 60, node="g1",
                     sweeps=lambda health: [NvmlReliabilitySource(fake_nvml, selection=selection)],
                     selection=selection)
    for poller in exporter.pollers:
        assert poller.poll_once()
    samples = [s for f in text_string_to_metric_families(generate_latest(exporter.registry).decode())
               for s in f.samples if s.labels.get("vendor") == "cuda"]
    by_device: dict[str, set[str]] = {}
    for s in samples:
        by_device.setdefault(s.labels["device"], set()).add(s.labels.get("model"))
    assert by_device == {"0": {"NVIDIA H200"}, "1": {"NVIDIA A100-SXM4-80GB"}}
    families = {s.name for s in samples}
    assert {"npudist_device_ecc_uncorrected_errors_total", "npudist_device_memory_remapped_rows",
            "npudist_device_clock_throttle_active", "npudist_device_power_watts"} <= families
    info = [s for s in samples if s.name == "npudist_device_info"]
    assert len(info) == 2 and all("health" not in s.labels for s in info)
    assert all(s.labels["bus_id"] for s in info)
    assert not [s for s in samples if any(v == "" for v in s.labels.values())], "no empty label anywhere"
