"""A simulated Ascend NPU: device type ``npu``, tensors in host memory, and an ``hccl`` backend over gloo.

``install(mode)`` makes this process look like one with torch_npu on one Ascend chip: PrivateUse1 is
renamed ``npu`` (the slot torch_npu itself uses), ``torch.npu`` is the device module in ``device.py``,
tensors moved there are ``SimTensor``s computing with the CPU's kernels, and the ``hccl`` backend is
registered for ``npu`` only. It proves placement, backend choice, HCCL's dtype and layout rules and
npudist's own paths; it cannot prove speed, HCCL's real algorithms or anything of CANN.

Nothing happens at import. ``npudist launch --simulate npu[:strict]`` or ``NPUDIST_SIMULATE`` makes the
accelerator detection install it (the ``npu-sim`` vendor row), and the ``torch_npu`` stand-in under
``stand_in/`` installs it for scripts written for torch_npu. In a simulating process npudist's ``torch.backends``
entry point (``autoload.py``) loads that stand-in at ``import torch``, as torch_npu's entry point loads
torch_npu, so ``torch.npu`` and ``"npu:0"`` exist without ``import torch_npu``.
"""

from __future__ import annotations

import atexit
from collections.abc import Mapping
from types import MappingProxyType

from npudist.runtime.settings import SIMULATE_MODES

MODES: Mapping[str, str] = MappingProxyType(dict(zip(SIMULATE_MODES, ("hccl", "hccl-strict"), strict=True)))
"""``--simulate`` / NPUDIST_SIMULATE value -> the constraint row (comm/constraints.py) the simulated HCCL
enforces."""


class SimulationError(RuntimeError):
    """The simulated NPU cannot be installed in this process; the message says why."""


def parse_mode(value: str) -> str:
    """Normalise a ``--simulate`` value, or SimulationError listing the valid ones."""
    mode = value.strip().lower()
    if mode not in MODES:
        raise SimulationError(f"cannot simulate {value!r}; choose one of {', '.join(MODES)}")
    return mode


def install(mode: str = "npu", chips: int = 8) -> None:
    """Make this process's ``npu`` device the simulated one; a second call with the same mode does nothing."""
    import torch

    from npudist.runtime import compat

    try:
        compat.require("python_privateuse1", "the simulated NPU (--simulate npu)")
    except compat.TorchTooOld as exc:
        raise SimulationError(str(exc)) from None
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from npudist.comm.constraints import PROFILES
    from npudist.sim import autocast, guard, hccl, host_memory, serialization
    from npudist.sim.device import SimDeviceModule
    from npudist.sim.state import SIM
    from npudist.sim.tensor import DEVICE_TYPE, register_allocation_kernels

    row = MODES[parse_mode(mode)]
    if SIM.row is not None:
        if SIM.row != row:
            raise SimulationError(f"the simulated NPU is already installed with the {SIM.row} row, not {row}")
        return
    taken = torch._C._get_privateuse1_backend_name()
    if taken not in ("privateuseone", DEVICE_TYPE) or hasattr(torch, DEVICE_TYPE):
        raise SimulationError(f"the PrivateUse1 device slot is already taken ({taken!r}, torch.{DEVICE_TYPE} "
                              "exists): is the real torch_npu loaded? Simulate in a process without it.")
    SIM.chips = chips
    # The C++ guard first, where it builds: torch's Python guard only registers where none is (sim/guard.py).
    guard.load(chips)
    _setup_privateuseone_for_python_backend(DEVICE_TYPE, backend_module=SimDeviceModule(chips))
    SIM.library = torch.library.Library("aten", "IMPL")
    register_allocation_kernels(SIM.library)
    host_memory.register(SIM.library)
    autocast.register(SIM.library)
    SIM.autocast_fallthrough = autocast.fallthrough()
    hccl.register(PROFILES[row])
    serialization.register()
    atexit.register(_rest_before_finalizing)
    SIM.row = row


def _rest_before_finalizing() -> None:
    """Every simulated tensor is a Python object, so an autograd device thread that drops one (a backward's
    last gradient, the graph it ran) needs the GIL; when that comes after the main thread started to finalize,
    CPython ends the thread and the process aborts (``terminate called without an active exception``, the race
    comm/quiesce.py describes for gloo's workers). A script that never calls ``npudist.init()`` has no Runtime
    to wait for this at exit, so the simulation does: the same bounded wait, at exit, while the interpreter
    is whole."""
    from npudist.comm.quiesce import quiesce

    quiesce()


def activate() -> str | None:
    """Install the simulation this process's settings ask for (NPUDIST_SIMULATE, NPUDIST_SIM_CHIPS);
    None when it is in place, else why not. Called by accelerator detection (the ``npu-sim`` row)."""
    from npudist.runtime.state import current

    settings = current().settings
    try:
        install(settings.simulate or "npu", chips=settings.sim_chips)
    except SimulationError as exc:
        return str(exc)
    return None


def installed() -> str | None:
    """The constraint row of the installed simulation, or None when this process has no simulated NPU."""
    from npudist.sim.state import SIM

    return SIM.row
