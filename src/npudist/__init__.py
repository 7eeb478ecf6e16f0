"""npudist: distributed PyTorch that runs the same way on NPUs, GPUs, MLUs, RK3588 boards and CPUs."""

from npudist._version import __version__
from npudist.accelerators import Accelerator, AcceleratorUnavailable, accelerator
from npudist.comm import all_gather, all_reduce, all_reduce_many, broadcast, constraints, reduce_scatter
from npudist.comm.ddp import ddp
from npudist.dist import DistContext, DistInitError, init, shutdown

__all__ = [
    "Accelerator",
    "AcceleratorUnavailable",
    "DistContext",
    "DistInitError",
    "__version__",
    "accelerator",
    "all_gather",
    "all_reduce",
    "all_reduce_many",
    "broadcast",
    "constraints",
    "ddp",
    "init",
    "reduce_scatter",
    "shutdown",
]
