"""An event on the host clock, for ``npudist.accelerator().event()`` where the device is the CPU.

It keeps the calls of torch.cuda.Event that timing code makes (record, synchronize, query, wait,
elapsed_time in milliseconds). The host clock is exact there: CPU kernels have finished when the call
that issued them returns, so there is no queue to wait for.
"""

from __future__ import annotations

import time
from typing import Any


class HostEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing
        self._at: float | None = None

    def record(self, stream: Any = None) -> None:
        self._at = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: HostEvent) -> float:
        """Milliseconds from this event to ``end``, as torch.cuda.Event.elapsed_time; both must be recorded
        with ``enable_timing=True`` (torch raises otherwise, so this does too)."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("elapsed_time needs both events made with enable_timing=True")
        if self._at is None or end._at is None:
            raise RuntimeError("elapsed_time: record() both events first")
        return (end._at - self._at) * 1000.0
