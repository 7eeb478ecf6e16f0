"""The NVML source on a real GPU returns plausible values in base units, and the node exporter serves them.

Plausible, from the NVML API reference (nvmlDeviceGetPowerUsage: milliwatts; nvmlMemory_t: bytes, and
``used`` is reserved plus allocated memory; temperature in degrees C): board power 10-1500 W, GPU
temperature 10-110 °C, memory total within 5 % of what CUDA reports for the same device.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import FAKES, child_env, free_port
from tests.telemetry.exp_helpers import families, scrape

pytestmark = pytest.mark.cuda

GIB = 1 << 30


def _pynvml():
    try:
        import pynvml
    except ImportError:
        pytest.fail("pynvml is not installed: pip install nvidia-ml-py (npudist[nvidia]); "
                    "scripts/device-check.sh installs it when a GPU is present")
    assert FAKES not in Path(pynvml.__file__).resolve().parents, "the fake pynvml was imported, not NVML"
    return pynvml


def _bus(bus_id: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of an NVML busId such as 00000000:3B:00.0."""
    m = re.fullmatch(r"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.[0-9a-fA-F]+", (bus_id or "").strip())
    return tuple(int(g, 16) for g in m.groups()) if m else None  # type: ignore[return-value]


def _reading_of_cuda0(readings):
    """NVML's reading of the GPU torch calls cuda:0: NVML ignores CUDA_VISIBLE_DEVICES and may order
    devices otherwise, so match the PCI address where torch reports it."""
    if len(readings) == 1:
        return readings[0]
    props = torch.cuda.get_device_properties(0)
    want = tuple(getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
    if None in want:
        pytest.fail(f"{len(readings)} GPUs and torch gives no PCI address for cuda:0 to match NVML's")
    matches = [r for r in readings if _bus(r.bus_id) == want]
    assert len(matches) == 1, f"cuda:0 at PCI {want}; NVML bus ids: {[r.bus_id for r in readings]}"
    return matches[0]


def _check_plausible(r, total_cuda: int) -> None:
    assert r.vendor == "cuda" and r.name, r
    assert r.power_watts is not None and 10 <= r.power_watts <= 1500, r
    assert r.temperature_celsius is not None and 10 <= r.temperature_celsius <= 110, r
    assert r.memory_total_bytes is not None and abs(r.memory_total_bytes - total_cuda) <= 0.05 * total_cuda, \
        (r.memory_total_bytes, total_cuda)
    assert r.memory_used_bytes is not None and 0 < r.memory_used_bytes <= r.memory_total_bytes, r
    if r.utilization_ratio is not None:
        assert 0 <= r.utilization_ratio <= 1, r
    if r.frequency_hertz is not None:  # SM clock: H200 idles near 345 MHz and boosts to about 2 GHz
        assert 50e6 <= r.frequency_hertz <= 4e9, r


@pytest.mark.timeout(120)
def test_nvml_source_reads_plausible_values() -> None:
    _pynvml()
    from npudist.telemetry.sources.nvml import NvmlSource

    source = NvmlSource()
    try:
        torch.ones(1, device="cuda:0")  # the CUDA context exists before the first reading
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        readings = source.read()
        assert len(readings) >= torch.cuda.device_count(), readings
        mine = _reading_of_cuda0(readings)
        _check_plausible(mine, torch.cuda.get_device_properties(0).total_memory)
        # 1 GiB through the caching allocator is one cudaMalloc: NVML's used memory must grow by it.
        block = torch.empty(GIB, dtype=torch.uint8, device="cuda:0")
        block.fill_(1)
        torch.cuda.synchronize()
        after = _reading_of_cuda0(source.read())
        grown = after.memory_used_bytes - mine.memory_used_bytes
        assert grown >= 0.9 * GIB, f"NVML used memory grew by {grown} bytes after a 1 GiB allocation"
        del block
        torch.cuda.empty_cache()
    finally:
        source.close()


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_exporter_serves_nvml_values() -> None:
    _pynvml()
    port = free_port()
    # --source auto: on a CUDA host the vendor table's telemetry source for cuda is NVML.
    proc = subprocess.Popen([sys.executable, "-m", "npudist", "exporter", "--listen", f"127.0.0.1:{port}",
                             "--source", "auto", "--interval", "500ms"],
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        text, deadline = "", time.monotonic() + 60
        while "npudist_device_power_watts{" not in text and time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            with contextlib.suppress(OSError):  # not listening yet
                text = scrape(f"http://127.0.0.1:{port}/metrics", timeout=5)
            time.sleep(0.5)
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate(timeout=10)
    assert "npudist_device_power_watts{" in text, f"no NVML power sample within 60 s; exporter said:\n{err[-3000:]}"
    fams = families(text)

    def by_device(name: str) -> dict[str, float]:
        fam = fams.get(name)
        return {s.labels["device"]: s.value for s in (fam.samples if fam else [])
                if s.name == name and s.labels.get("vendor") == "cuda"}

    up = by_device("npudist_device_up")
    assert len(up) >= torch.cuda.device_count() and set(up.values()) == {1.0}, up
    watts, celsius = by_device("npudist_device_power_watts"), by_device("npudist_device_temperature_celsius")
    totals = by_device("npudist_device_memory_total_bytes")
    assert set(watts) == set(celsius) == set(totals) == set(up), (watts, celsius, totals)
    total_cuda = {torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())}
    for device in up:
        assert 10 <= watts[device] <= 1500 and 10 <= celsius[device] <= 110, (device, watts, celsius)
        assert any(abs(totals[device] - t) <= 0.05 * t for t in total_cuda), (device, totals, total_cuda)
    errors = [s for f in fams.values() for s in f.samples
              if s.name == "npudist_collector_errors_total" and s.labels.get("collector") == "nvml" and s.value]
    assert not errors, errors
