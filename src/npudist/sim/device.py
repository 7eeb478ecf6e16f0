"""``torch.npu`` of the simulated NPU: the device calls npudist, DDP and torch_npu scripts make.

A process sees the chips a process on a real host sees: ``device_count()`` is the length of
``ASCEND_RT_VISIBLE_DEVICES`` when set, else the host's chips (8, an Atlas 800T A2), so a script written the
way Ascend's examples are (``torch.npu.set_device(local_rank)``, ``device_ids=[local_rank]``,
``f"npu:{local_rank}"``) runs unchanged. With the simulation's C++ device guard (guard.py) each ``npu:i`` is a
device of its own: tensors carry their index, ``set_device`` moves the current device, and an op or a collective
mixing two devices fails as it does on the chip. Without it (no compiler), torch's Python device guard reports
one device (torch/csrc/acc/Module.cpp, ``PythonDeviceGuard::deviceCount`` returns 1) and autograd's engine
asserts on an index it has no queue for, so every simulated tensor lives on ``npu:0`` whatever index made it;
``current_device()`` then returns the index set.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from npudist.sim import guard
from npudist.sim.chips import (  # noqa: F401
    VISIBLE_VAR,
    SimDeviceError,
    check_index,
    chip_number,
    device_index,
    physical_chip,
    visible_count,
)
from npudist.sim.names import TORCH_NPU_NAMES, NotSimulated
from npudist.sim.state import SIM
from npudist.sim.streams import Event, Stream
from npudist.sim.tensor import DEVICE_TYPE

SIM_TOTAL_MEMORY = 64 * 1024**3
"""What the simulated chip reports as its memory: an Atlas 800T A2's 64 GiB of HBM (its datasheet)."""


class DeviceProperties(NamedTuple):
    """The fields of torch_npu's ``_NPUDeviceProperties`` a script reads (torch_npu/csrc/npu/Module.cpp binds
    name, total_memory, cube_core_num, vector_core_num, L2_cache_size, major, minor, multi_processor_count)."""

    name: str
    total_memory: int
    cube_core_num: int = 24
    vector_core_num: int = 48
    L2_cache_size: int = 192 * 1024**2
    major: int = 0
    minor: int = 0
    multi_processor_count: int = 24


class _Flags(types.SimpleNamespace):
    """``torch.npu.config`` / ``matmul`` / ``conv``: switches a torch_npu script sets (allow_internal_format,
    allow_hf32). They change how a real chip picks formats and precisions; host kernels have one of each, so
    they are kept and read back, and change nothing."""


class SimDeviceModule(types.ModuleType):
    """``torch.npu`` (and ``torch_npu.npu``): what npudist, DDP, torch.amp or a torch_npu script calls.

    A module, as torch_npu's ``torch.npu`` is, so ``import torch.npu.amp`` and ``from torch.npu import amp``
    work. A name torch_npu has and this module does not raises ``NotSimulated`` naming it.
    """

    Stream = Stream
    Event = Event

    def __init__(self, chips: int) -> None:
        super().__init__("torch.npu", __doc__)
        self.chips = chips
        self._stream: Stream | None = None
        self._current = 0
        self.config = _Flags(allow_internal_format=True)
        self.matmul = _Flags(allow_hf32=False)
        self.conv = _Flags(allow_hf32=True)
        from npudist.sim import npu_amp

        self.amp = npu_amp.module()
        self.utils = self  # torch_npu.npu.utils holds the same device calls (set_device, synchronize, ...)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names neither the instance nor the class has.
        if name == "_lazy_init":
            return SIM.initialize
        if name in TORCH_NPU_NAMES:
            raise NotSimulated(f"torch.npu.{name}")
        raise AttributeError(f"module 'torch.npu' has no attribute '{name}'")

    def __repr__(self) -> str:
        return "<module 'torch.npu' (npudist's simulated NPU)>"

    # The device calls, named as in torch_npu (torch_npu.npu: is_available ... memory_reserved).
    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        # As torch_npu's (and torch.cuda's): False until a device is set or a tensor made on one. DeviceMesh
        # reads it to decide whether to set the device from LOCAL_RANK (torch/distributed/device_mesh.py).
        # Without the C++ guard every tensor is on npu:0, and a current device set to LOCAL_RANK would make
        # FSDP2 refuse them: True then, so DeviceMesh leaves the device alone.
        return SIM.initialized or not guard.available()

    def _is_in_bad_fork(self) -> bool:
        return False

    def device_count(self) -> int:
        return visible_count()

    def set_device(self, device: Any) -> None:
        self._current = check_index(device_index(device))
        guard.set_current(self._current)
        SIM.initialize()

    def current_device(self) -> int:
        return guard.current() if guard.available() else self._current

    def get_device_name(self, device: Any = None) -> str:
        index = check_index(self.current_device() if device is None else device_index(device))
        if not guard.available():  # one device per process: it stands for this rank's chip
            return f"simulated Ascend NPU (chip {physical_chip(chips=self.chips)})"
        listed = [c.strip() for c in os.environ.get(VISIBLE_VAR, "").split(",") if c.strip()]
        return f"simulated Ascend NPU (chip {chip_number(listed[index]) if listed else index})"

    def get_device_properties(self, device: Any = None) -> DeviceProperties:
        return DeviceProperties(name=self.get_device_name(device), total_memory=SIM_TOTAL_MEMORY)

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        """(free, total) bytes, as torch_npu answers (torch_npu/npu/__init__.py mem_get_info): the chip's
        memory less what live simulated tensors hold."""
        check_index(device_index(device))
        return max(0, SIM_TOTAL_MEMORY - SIM.allocations.allocated), SIM_TOTAL_MEMORY

    def get_device_capability(self, device: Any = None) -> tuple[int, int] | None:
        # torch_npu returns TORCH_NPU_DEVICE_CAPABILITY ("major.minor") when set, else None
        # (torch_npu/npu/__init__.py get_device_capability: "only for compatibility with PyTorch").
        text = os.environ.get("TORCH_NPU_DEVICE_CAPABILITY", "")
        major, _, minor = text.partition(".")
        return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None

    def is_bf16_supported(self, including_emulation: bool = False) -> bool:
        return True

    def can_device_access_peer(self, device: Any, peer_device: Any) -> bool:
        check_index(device_index(device))
        check_index(device_index(peer_device))
        return False

    def set_compile_mode(self, jit_compile: bool = False) -> None:
        # Selects CANN's operator compilation on a real chip; the host kernels are compiled already.
        self.jit_compile = jit_compile

    def is_jit_compile_false(self) -> bool:
        return not getattr(self, "jit_compile", False)

    def init(self) -> None:
        return None

    def ipc_collect(self) -> None:
        return None

    def is_current_stream_capturing(self) -> bool:
        return False  # there are no graphs to capture (NPUGraph is not simulated)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [self.get_rng_state()]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        self.set_rng_state(states[0])

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        self._fraction = fraction

    def get_per_process_memory_fraction(self, device: Any = None) -> float:
        return getattr(self, "_fraction", 1.0)

    def is_autocast_enabled(self) -> bool:
        return torch.is_autocast_enabled(DEVICE_TYPE)

    def set_autocast_enabled(self, enabled: bool) -> None:
        torch.set_autocast_enabled(DEVICE_TYPE, enabled)

    def get_autocast_dtype(self) -> torch.dtype:
        return torch.get_autocast_dtype(DEVICE_TYPE)

    def set_autocast_dtype(self, dtype: torch.dtype) -> None:
        torch.set_autocast_dtype(DEVICE_TYPE, dtype)

    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        return (f"simulated NPU memory: {self.memory_allocated(device)} bytes allocated, "
                f"{self.memory_reserved(device)} bytes reserved (peak)")

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        """The caching allocator's flat counters under torch_npu's keys (torch_npu/npu/memory.py memory_stats, the
        same names as torch.cuda's): torchtitan's DeviceMemoryMonitor reads active_bytes.all.peak,
        reserved_bytes.all.peak, num_alloc_retries and num_ooms. Every byte allocated is active (nothing is
        cached), and host memory neither retries nor runs out as a chip's does."""
        allocated, reserved = self.memory_allocated(device), self.memory_reserved(device)
        return {"active_bytes.all.current": allocated, "active_bytes.all.peak": reserved,
                "allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": reserved,
                "reserved_bytes.all.current": reserved, "reserved_bytes.all.peak": reserved,
                "num_alloc_retries": 0, "num_ooms": 0}

    def seed(self) -> None:
        SIM.rng.manual_seed(torch.randint(0, 2**63 - 1, ()).item())

    seed_all = seed

    def initial_seed(self) -> int:
        return SIM.rng.seed

    def device_of(self, obj: Any) -> Any:
        """The device context of a tensor: its device on the NPU, none (-1) for a host tensor."""
        on_npu = isinstance(obj, torch.Tensor) and obj.device.type == DEVICE_TYPE
        return self.device(obj.get_device() if on_npu else -1)

    def set_stream(self, stream: Stream | None) -> None:
        return None

    def synchronize(self, device: Any = None) -> None:
        check_index(device_index(device))

    def current_stream(self, device: Any = None) -> Stream:
        if self._stream is None:
            self._stream = Stream(0)
        return self._stream

    def default_stream(self, device: Any = None) -> Stream:
        return self.current_stream(device)

    @contextlib.contextmanager
    def stream(self, stream: Stream | None) -> Iterator[None]:
        yield

    def memory_allocated(self, device: Any = None) -> int:
        check_index(device_index(device))
        return SIM.allocations.allocated

    def memory_reserved(self, device: Any = None) -> int:
        check_index(device_index(device))
        return max(SIM.allocations.peak, SIM.allocations.allocated)

    def max_memory_allocated(self, device: Any = None) -> int:
        return self.memory_reserved(device)

    def reset_max_memory_allocated(self, device: Any = None) -> None:
        self.reset_peak_memory_stats(device)

    reset_max_memory_cached = reset_max_memory_allocated

    def memory_cached(self, device: Any = None) -> int:
        return self.memory_reserved(device)

    def max_memory_cached(self, device: Any = None) -> int:
        return self.max_memory_reserved(device)

    def max_memory_reserved(self, device: Any = None) -> int:
        # Host memory is handed back when a tensor dies: nothing is cached, so reserved is the peak in use.
        return self.memory_reserved(device)

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        SIM.allocations.reset_peak()

    def empty_cache(self) -> None:
        SIM.allocations.reset_peak()

    def manual_seed(self, seed: int) -> None:
        # The device's own generator (sim/rng.py), as torch_npu's; torch.manual_seed reaches it through
        # manual_seed_all (torch/random.py, _seed_custom_device).
        SIM.rng.manual_seed(seed)

    manual_seed_all = manual_seed

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return SIM.rng.get_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        # DTensor's RNG tracker hands back the state as it read it (torch/distributed/tensor/_random.py), at times
        # a device tensor: its host bytes are the state.
        from npudist.sim.tensor import SimTensor

        SIM.rng.set_state(state.elem if isinstance(state, SimTensor) else state.to("cpu"))

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        # What torch.autocast(device_type) asks a PrivateUse1 module for (torch/amp/autocast_mode.py);
        # torch_npu answers fp16 and bf16 (torch_npu/npu/amp/autocast_mode.py).
        return [torch.float16, torch.bfloat16]

    @contextlib.contextmanager
    def device(self, device: Any) -> Iterator[None]:
        # torch.load(map_location="npu:0") moves storages inside this guard (torch/_utils.py::_to);
        # torch.npu.device(-1), as device_of gives for a host tensor, selects nothing (as torch.cuda.device).
        if isinstance(device, int) and device < 0:
            yield
            return
        before = self.current_device()
        self.set_device(device)
        try:
            yield
        finally:
            self.set_device(before)


SIMULATED = (*sorted(name for name, value in vars(SimDeviceModule).items()
                     if not name.startswith("_") and (callable(value) or isinstance(value, type))),
             "amp", "config", "conv", "matmul", "utils")
"""The public names of ``torch.npu`` the simulation provides (transfer_to_npu copies them onto torch.cuda;
docs/guide/simulated-npu.md lists them)."""
