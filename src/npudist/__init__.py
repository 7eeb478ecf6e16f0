"""npudist: distributed PyTorch that runs the same way on NPUs, GPUs, MLUs, RK3588 boards and CPUs.

The public names load on first use, so ``import npudist`` (and the CLI that explains a broken vendor
stack) works even where ``import torch`` fails.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from npudist._lazy import exports, install_moved, listing
from npudist._version import __version__

if TYPE_CHECKING:
    from npudist.accelerators import Accelerator, AcceleratorUnavailable, accelerator
    from npudist.comm import active_constraints as constraints
    from npudist.comm import all_gather, all_reduce, all_reduce_many, broadcast, busy, reduce_scatter
    from npudist.lifecycle import DistContext, DistInitError, init, shutdown
    from npudist.training import ddp, log, loop, step
    from npudist.training.sentinel import NonFiniteError

_WHERE = MappingProxyType({
    "Accelerator": "npudist.accelerators",
    "AcceleratorUnavailable": "npudist.accelerators",
    "accelerator": "npudist.accelerators",
    "all_gather": "npudist.comm",
    "all_reduce": "npudist.comm",
    "all_reduce_many": "npudist.comm",
    "broadcast": "npudist.comm",
    "busy": "npudist.comm",
    "constraints": ("npudist.comm", "active_constraints"),
    "reduce_scatter": "npudist.comm",
    "ddp": "npudist.training",
    "log": "npudist.training",
    "loop": "npudist.training",
    "step": "npudist.training",
    "DistContext": "npudist.lifecycle",
    "DistInitError": "npudist.lifecycle",
    "init": "npudist.lifecycle",
    "shutdown": "npudist.lifecycle",
    "NonFiniteError": "npudist.training.sentinel",
})
_MOVED = MappingProxyType({
    # old path -> new path (docs/architecture.md); kept for one release, tests/test_moved_paths.py
    "npudist.backend_guard": "npudist.accelerators.backend_guard",
    "npudist.toolrun": "npudist.runtime.toolrun",
    "npudist.runlog_schema": "npudist.telemetry.runlog_schema",
    "npudist.sentinel": "npudist.training.sentinel",
    "npudist.dry_run": "npudist.training.dry_run",
    "npudist.accelerators.place": "npudist.diagnosis.place",
    "npudist.comm.rank_states": "npudist.diagnosis.rank_states",
    "npudist.comm.watchdog": "npudist.comm.hang.watchdog",
    "npudist.comm.hang_reader": "npudist.comm.hang.reader",
    "npudist.comm.progress_store": "npudist.comm.hang.store",
    "npudist.telemetry.job.detector": "npudist.diagnosis.straggler.detector",
    "npudist.telemetry.job.student_t": "npudist.diagnosis.straggler.student_t",
    "npudist.telemetry.job.skew": "npudist.diagnosis.straggler.skew",
    "npudist.launch_options": "npudist.launch.options",
    "npudist.launch_multinode": "npudist.launch.multinode",
    "npudist.launch_scope": "npudist.launch.scope",
    "npudist.launch_hint": "npudist.launch.hint",
    "npudist.torchrun_parser": "npudist.launch.torchrun_parser",
    "npudist.comm.bench_rank": "npudist.bench.rank",
})
install_moved(_MOVED)
_SUBPACKAGES = frozenset({"accelerators", "checkpoint", "comm", "dashboards", "doctor", "edge", "infer", "lifecycle",
                          "migrate", "ops", "report", "runtime", "telemetry", "training"})

__all__ = [
    "Accelerator",
    "AcceleratorUnavailable",
    "DistContext",
    "DistInitError",
    "NonFiniteError",
    "__version__",
    "accelerator",
    "all_gather",
    "all_reduce",
    "all_reduce_many",
    "broadcast",
    "busy",
    "constraints",
    "ddp",
    "init",
    "log",
    "loop",
    "reduce_scatter",
    "shutdown",
    "step",
]


__getattr__ = exports(__name__, _WHERE, submodules=_SUBPACKAGES)
__dir__ = listing(__name__, _WHERE, submodules=_SUBPACKAGES)
