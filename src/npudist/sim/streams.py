"""Streams and events of the simulated NPU: work runs synchronously on the host, so every stream is idle and
every event has completed; ``elapsed_time`` measures host time between two records."""

from __future__ import annotations

import time
from typing import Any

import torch

from npudist.sim.chips import SimDeviceError, check_index, device_index
from npudist.sim.state import SIM
from npudist.sim.tensor import DEVICE_TYPE

_PRIVATEUSE1 = int(torch._C._autograd.DeviceType.PrivateUse1.value)
"""c10's DeviceType number of the slot ``npu`` occupies: what ``device_type`` of a stream on it is."""


class Stream:
    """A stream on the simulated NPU: work runs when issued, so every stream is always done.

    It carries the fields of torch_npu's stream (``torch_npu.npu.Stream``, on ``_NPUStreamBase``, as
    ``torch.cuda.Stream``: ``stream_id``, ``device_index``, ``device_type``): FSDP2 on torch >= 2.15 hands them to
    ``torch.ops.fsdp.record_grad_output_stream`` (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).
    """

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        check_index(device_index(device))
        self.device = torch.device(DEVICE_TYPE, 0)  # every simulated tensor's device (module docstring)
        self.priority = priority
        self.stream_id = next(SIM.stream_ids)
        self.device_index = self.device.index
        self.device_type = _PRIVATEUSE1

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: Stream) -> None:
        return None

    def wait_event(self, event: Event) -> None:
        return None

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event


class Event:
    """An event that records the host clock: elapsed_time is the host time between two records."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._t: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        self._t = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: Event) -> float:
        if self._t is None or end._t is None:
            raise SimDeviceError("elapsed_time: both events must be recorded first")
        return (end._t - self._t) * 1000.0
