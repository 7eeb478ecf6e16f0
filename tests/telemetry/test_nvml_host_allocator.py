"""NVML (against tests/fakes/pynvml.py), host (psutil, real and faked) and allocator readings."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from npudist.telemetry import SourceError
from npudist.telemetry.job.allocator import allocator_reading, read_allocator
from npudist.telemetry.sources.host_psutil import HostSource
from npudist.telemetry.sources.nvml import NvmlSource

FAKES = Path(__file__).resolve().parents[1] / "fakes"


@pytest.fixture
def fake_nvml(monkeypatch):
    """A fresh copy of tests/fakes/pynvml.py per test (its GPU list is module state)."""
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKES / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fake_pynvml", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_nvml_units(fake_nvml):
    odd = fake_nvml.FakeGpu(name=b"Tesla T4", power_mw=None, util_gpu_pct=250, bus_id=b"00000000:3B:00.0",
                            sm_clock_mhz=None)
    fake_nvml.GPUS = [fake_nvml.FakeGpu(), odd]
    src = NvmlSource(nvml=fake_nvml)
    a, b = src.read()
    assert (a.vendor, a.device_id, a.name) == ("cuda", 0, "NVIDIA H100 80GB HBM3")
    assert a.power_watts == 250.5  # 250500 mW
    assert a.temperature_celsius == 41.0
    assert a.utilization_ratio == 0.37
    assert a.frequency_hertz == 1980e6
    assert (a.memory_used_bytes, a.memory_total_bytes) == (1073741824, 85520809984)
    assert a.bus_id == "00000000:18:00.0"
    # NOT_SUPPORTED -> None; an impossible 250 % -> None; bytes names decoded
    assert (b.name, b.power_watts, b.utilization_ratio, b.frequency_hertz) == ("Tesla T4", None, None, None)
    assert b.bus_id == "00000000:3B:00.0"
    src.close()


def test_nvml_init_failure_is_missing(fake_nvml):
    fake_nvml.INIT_ERROR = fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(SourceError) as err:
        NvmlSource(nvml=fake_nvml).read()
    assert err.value.reason == "missing" and "driver" in str(err.value)


def test_nvml_package_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(SourceError) as err:
        NvmlSource().read()
    assert err.value.reason == "missing" and "nvidia-ml-py" in str(err.value)


def test_host_real_psutil():
    (r,) = HostSource().read()
    assert (r.vendor, r.device_id) == ("cpu", 0)
    assert 0.0 <= r.utilization_ratio <= 1.0
    assert 0 < r.memory_used_bytes < r.memory_total_bytes


def test_host_conversions_with_fake_psutil():
    fake = SimpleNamespace(
        cpu_percent=lambda interval=None: 25.0 if interval == HostSource.MEASURE_S else 0.0,
        virtual_memory=lambda: SimpleNamespace(total=16 * 2**30, available=4 * 2**30),
        cpu_freq=lambda: SimpleNamespace(current=2400.0),
    )
    (r,) = HostSource(psutil=fake).read()
    assert (r.utilization_ratio, r.frequency_hertz) == (0.25, 2.4e9)
    assert (r.memory_used_bytes, r.memory_total_bytes) == (12 * 2**30, 16 * 2**30)


def test_host_cpu_is_measured_within_each_read_not_since_another_threads_call():
    """The poller reads in a new thread each time, and psutil keeps cpu_percent(interval=None)'s previous call
    per thread: every sample was that call's meaningless 0.0."""
    results = []
    done = threading.Event()

    def spin() -> None:
        while not done.is_set():
            sum(i * i for i in range(10_000))

    burn = threading.Thread(target=spin, daemon=True)
    burn.start()  # this process itself keeps a core busy until both readings are taken (a fixed amount of work
    # could end before the second one on a fast core, which then reads an idle host)
    src = HostSource()
    for _ in range(2):
        reader = threading.Thread(target=lambda: results.append(src.read()[0].utilization_ratio))
        reader.start()
        reader.join()
    done.set()
    burn.join()
    assert all(r > 0.0 for r in results), results


def test_host_failure_is_source_error():
    def boom(interval=None):
        raise OSError("no /proc")

    fake = SimpleNamespace(cpu_percent=boom, virtual_memory=lambda: None, cpu_freq=lambda: None)
    with pytest.raises(SourceError):
        HostSource(psutil=fake).read()


def test_allocator_fragmentation():
    r = allocator_reading({"allocated_bytes": 3 * 2**20, "reserved_bytes": 4 * 2**20})
    assert (r.allocated_bytes, r.reserved_bytes, r.fragmentation_ratio) == (3 * 2**20, 4 * 2**20, 0.25)
    assert allocator_reading({"allocated_bytes": 0, "reserved_bytes": 0}).fragmentation_ratio is None
    assert allocator_reading({}) is None  # CPU: no allocator stats
    assert allocator_reading({"allocated_bytes": 5, "reserved_bytes": 4}) is None
    assert allocator_reading({"allocated_bytes": -1, "reserved_bytes": 4}) is None


def test_read_allocator_from_accelerator():
    from npudist.accelerators import accelerator

    assert read_allocator(accelerator()) is None  # CPU build here: memory_stats() is {}

    class Broken:
        def memory_stats(self, index=None):
            raise RuntimeError("device lost")

    assert read_allocator(Broken()) is None
    fake = SimpleNamespace(memory_stats=lambda index=None: {"allocated_bytes": 1, "reserved_bytes": 2})
    assert read_allocator(fake).fragmentation_ratio == 0.5
