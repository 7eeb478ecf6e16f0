"""The vendor table: everything npudist needs to know about an accelerator family, as data.

Adding a vendor means adding a row here (and, only if it truly differs, a small module such as
``rknpu.py``). Nothing else in npudist branches on vendor names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Vendor:
    name: str
    """What users type (``NPUDIST_ACCELERATOR=npu``)."""
    device_type: str
    """torch device type that tensors live on (``torch.device(device_type, i)``)."""
    module: str | None
    """Python package whose import activates the device in torch (``torch_npu`` registers ``torch.npu``)."""
    backend: str
    """torch.distributed backend used when torch's own device->backend map has no entry."""
    visible_devices_var: str | None
    """Variable the vendor runtime reads to restrict the visible devices."""
    telemetry_source: str
    """Name of the telemetry collector that reads this vendor's devices."""
    stage_through_cpu: bool
    """Collectives must copy tensors to host memory first (no collective library on the device)."""
    tool: str | None
    """Vendor command-line tool that lists devices and the processes holding them."""
    default_nproc: int | None = None
    """Ranks per node for ``--nproc-per-node auto`` when device_count() says nothing useful."""
    board_probe: Callable[[], str | None] | None = None
    """Extra availability check for boards torch cannot see; returns why it is absent, or None."""
    runtime_setup: str | None = None
    """What makes the vendor runtime loadable when ``module`` is installed but fails to import."""
    activate: str | None = None
    """``module:function`` that makes the device exist in this process (the simulated NPU installs
    itself) and returns why it could not, or None. Named, not imported, like ``module``."""
    health_command: str | None = None
    """The card's health and vitals in the vendor's tool, with {card} (physical ID, as the tool numbers it)
    and {chip}: the next command a straggler or hang diagnosis names."""
    simulated: bool = False
    """The device is npudist's simulation (npudist.sim), not hardware: never picked by detection, only
    by NPUDIST_SIMULATE / ``npudist launch --simulate``."""


def _rknpu_probe() -> str | None:
    from npudist.accelerators import rknpu

    return rknpu.probe()


# Detection order is the order of this table (most specific first, CPU always last).
VENDORS: tuple[Vendor, ...] = (
    # Ascend: torch_npu registers torch.npu and the "hccl" backend on import
    # (https://gitee.com/ascend/pytorch, docs "Distributed training": backend="hccl").
    # CANN's set_env.sh puts libascendcl/libhccl on LD_LIBRARY_PATH (CANN install guide, "Configuring
    # Environment Variables").
    # Health: npu-smi command reference, `info -t health -i ID -c CHIP`.
    Vendor("npu", "npu", "torch_npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", "npu-smi", False, "npu-smi",
           health_command="npu-smi info -t health -i {card} -c {chip}",
           runtime_setup="source CANN's set_env.sh (e.g. `source /usr/local/Ascend/ascend-toolkit/set_env.sh`) "
           "so libhccl.so and the other CANN libraries are found"),
    Vendor("cuda", "cuda", None, "nccl", "CUDA_VISIBLE_DEVICES", "nvml", False, "nvidia-smi",
           health_command="nvidia-smi -q -i {card} -d TEMPERATURE,CLOCK,PERFORMANCE,ECC"),
    # Cambricon: torch_mlu registers torch.mlu and the "cncl" backend (Cambricon PyTorch user guide).
    Vendor("mlu", "mlu", "torch_mlu", "cncl", "MLU_VISIBLE_DEVICES", "cnmon", False, "cnmon",
           health_command="cnmon info -c {card}",  # Cambricon CNMon user guide, `info -c`
           runtime_setup="set NEUWARE_HOME to the Cambricon Neuware install and put $NEUWARE_HOME/lib64 on "
           "LD_LIBRARY_PATH"),
    # RK3588: one NPU per board, no collective library; torch computes on the CPU unless rknnlite runs
    # an .rknn model, and collectives go over gloo from host memory.
    Vendor("rknpu", "cpu", None, "gloo", None, "rknpu", True, None, default_nproc=1,
           board_probe=_rknpu_probe, health_command="cat /sys/kernel/debug/rknpu/load"),  # RKNPU driver debugfs
    Vendor("cpu", "cpu", None, "gloo", None, "cpu", False, None, default_nproc=2),
)

# The simulated Ascend NPU (npudist.sim): the npu row's device type and backend, the chips a rank of a real
# host sees (sim/device.py), 2 ranks for `--nproc-per-node auto` so a laptop runs it; never detected, only
# chosen by NPUDIST_SIMULATE.
SIMULATED_NPU = Vendor("npu-sim", "npu", None, "hccl", "ASCEND_RT_VISIBLE_DEVICES", "sim", False, None,
                       default_nproc=2, activate="npudist.sim:activate", simulated=True)

BY_NAME: Mapping[str, Vendor] = MappingProxyType({v.name: v for v in (*VENDORS, SIMULATED_NPU)})
