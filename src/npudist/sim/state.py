"""The simulated NPU's process-wide state: what a device driver would hold for the process.

One object, ``SIM``: torch's dispatcher, device-module registry and backend registry, which the
simulation plugs into, are process-wide and outlive any npudist Runtime, so the bytes live tensors hold
and the collectives run are kept beside them rather than in the Runtime.
"""

from __future__ import annotations

import itertools
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from npudist.sim.rng import SimGenerator


class Allocations:
    """Bytes of host storage held by live simulated tensors, counted once per storage.

    Views share a storage, so a storage is counted when its first wrapper appears and released when its
    last wrapper is collected. ``peak`` is the high-water mark since the last ``reset_peak``: what a
    caching allocator (CANN's, CUDA's) keeps reserved after tensors are freed.
    """

    def __init__(self) -> None:
        self.allocated = 0
        self.peak = 0
        self._holders: dict[int, list[int]] = {}  # storage data_ptr -> [nbytes, live wrappers]

    def track(self, wrapper: torch.Tensor, elem: torch.Tensor) -> None:
        storage = elem.untyped_storage()
        key = storage.data_ptr()
        entry = self._holders.get(key)
        if entry is None:
            entry = self._holders[key] = [storage.nbytes(), 0]
            self.allocated += entry[0]
            self.peak = max(self.peak, self.allocated)
        entry[1] += 1
        weakref.finalize(wrapper, self._release, key)

    def _release(self, key: int) -> None:
        entry = self._holders.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.allocated -= entry[0]
            del self._holders[key]

    def reset_peak(self) -> None:
        self.peak = self.allocated



@dataclass
class Counts:
    """Collectives the simulated backend ran in this process: calls and payload bytes per collective."""

    calls: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)

    def add(self, name: str, tensors: Iterable[torch.Tensor]) -> None:
        self.calls[name] += 1
        self.bytes[name] += sum(t.numel() * t.element_size() for t in tensors)



@dataclass
class SimState:
    allocations: Allocations = field(default_factory=Allocations)
    counts: Counts = field(default_factory=Counts)
    rng: SimGenerator = field(default_factory=SimGenerator)
    """The simulated NPU's generator (sim/rng.py)."""
    chips: int = 8
    """Chips of the simulated host (NPUDIST_SIM_CHIPS): what device_count() reports without a visible list."""
    initialized: bool = False
    """A device was set or a tensor made on one (torch.npu.is_initialized)."""
    guard: Any = None
    """The simulation's C++ device guard (a ctypes library, sim/guard.py), None while it is not loaded."""
    guard_reason: str | None = "not built yet"
    """Why the guard is not loaded (sim/guard.py)."""
    row: str | None = None
    """The constraint row the simulated ``hccl`` enforces; None until the simulation is installed."""
    library: Any = None
    """The torch.library registration of the allocation kernels (kept alive here)."""
    autocast_fallthrough: Any = None
    """The ``_`` library letting unlisted ops pass autocast (sim/autocast.py; kept alive here)."""
    stream_ids: Iterator[int] = field(default_factory=itertools.count)
    """Numbers for the simulated streams' ``stream_id`` (sim/streams.py), unique in the process as a chip's are."""
    funcol_outputs: weakref.WeakValueDictionary[int, torch.Tensor] = field(
        default_factory=weakref.WeakValueDictionary)
    """Host storage address -> a functional collective's output registered with its Work (sim/funcol.py; weak: an
    output that dies unwaited takes its entry with it)."""
    transferred: bool = False
    """transfer_to_npu's patches are applied (sim/transfer.py): they patch torch once per process."""
    autoload_failure: str | None = None
    """Why the ``torch.backends`` entry point could not install the simulation (sim/autoload.py); the entry
    point never raises, so this is where the reason is kept."""


    def initialize(self) -> None:
        self.initialized = True


SIM = SimState()
