"""Fake device sources and scrape helpers for the exporter-side telemetry tests."""

from __future__ import annotations

import threading
import urllib.request

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from npudist.telemetry.sources.readings import DeviceReading, ParseError, Source, SourceError

GIB = 1024**3


def eight_ascend() -> list[DeviceReading]:
    """8 simulated 910B3 chips: NPU ids 0..7, power 90+i W, 40+i C, 3 of 64 GiB HBM used, util i/10."""
    return [
        DeviceReading("npu", i, 0, name="910B3", health="OK", power_watts=90.0 + i,
                      temperature_celsius=40.0 + i, utilization_ratio=i / 10, frequency_hertz=None,
                      memory_used_bytes=3 * GIB, memory_total_bytes=64 * GIB, bus_id=f"0000:C{i}:00.0",
                      logical_id=i)
        for i in range(8)
    ]


class ScriptedSource(Source):
    """Plays a list of behaviours, one per read: a list of readings, an exception, or "hang"."""

    name = "fake"
    vendor = "npu"

    def __init__(self, script: list[object], name: str = "fake") -> None:
        self.script = list(script)
        self.name = name
        self.release = threading.Event()
        self.calls = 0

    def read(self) -> list[DeviceReading]:
        step = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if step == "hang":
            self.release.wait(60)
            return eight_ascend()
        if isinstance(step, BaseException):
            raise step
        return step  # type: ignore[return-value]


GARBAGE = ParseError("npu-smi printed no table header")
CRASH = SourceError("exit_code", "npu-smi exited with status 255")


def families(text: str) -> dict[str, object]:
    """Exposition text parsed back by prometheus_client's own parser, keyed by family name."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def registry_text(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def samples(fams: dict[str, object], family: str, sample: str | None = None) -> dict[tuple, float]:
    """{sorted label items: value} for one sample name of a family (default: the family's own name)."""
    want = sample or family
    return {tuple(sorted(s.labels.items())): s.value for s in fams[family].samples if s.name == want}


def scrape(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()
