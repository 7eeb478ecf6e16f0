"""The host itself (vendor "cpu"): CPU busy fraction, clock and memory through psutil.

psutil docs: ``virtual_memory().available`` is what can be given to processes without swapping, so used =
total - available; ``cpu_freq().current`` is MHz. The CPU busy fraction is measured over MEASURE_S within the
read: ``cpu_percent(interval=None)`` compares with the previous call *of the same thread* (psutil >= 5.9.6
keeps that state per thread id), and the poller runs every read in a new thread, so the non-blocking form
returned its meaningless first-call 0.0 in every sample.
"""

from __future__ import annotations

from types import ModuleType

from npudist.telemetry.sources import _values as v
from npudist.telemetry.sources.readings import DeviceReading, Source, SourceError


class HostSource(Source):
    """One reading for the whole host; ``psutil`` can be injected for tests."""

    name = "cpu"
    vendor = "cpu"

    MEASURE_S = 0.1
    """The window cpu_percent measures (psutil's advice: at least 0.1 s)."""

    def __init__(self, psutil: ModuleType | None = None) -> None:
        if psutil is None:
            import psutil
        self._psutil = psutil

    def read(self) -> list[DeviceReading]:
        ps = self._psutil
        try:
            percent = ps.cpu_percent(interval=self.MEASURE_S)
            memory = ps.virtual_memory()
        except Exception as exc:
            raise SourceError("error", f"psutil could not read the host: {exc}") from None
        try:
            freq = ps.cpu_freq()
        except Exception:  # not every platform has a CPU clock (psutil docs: may return None)
            freq = None
        mhz = getattr(freq, "current", None)
        total, available = memory.total, memory.available
        return [DeviceReading(
            vendor=self.vendor,
            device_id=0,
            name="cpu",
            utilization_ratio=v.ratio_from_percent(str(percent)),
            frequency_hertz=v.mhz_to_hertz(str(mhz)) if mhz else None,
            memory_used_bytes=total - available if 0 <= available <= total else None,
            memory_total_bytes=total if total > 0 else None,
        )]
