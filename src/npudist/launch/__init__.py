"""`npudist launch`: torchrun with device-aware defaults, or one MPI rank run directly.

planner.py turns the command line into a LaunchPlan without running anything, runner.py carries it out inside
scope.py's surroundings (signals, targets file, peer holder); options.py and torchrun_parser.py are the
command line (built without torch), devices.py and ports.py what a node offers, multinode.py the interface
that reaches the master, hint.py the CUDA hint after failed ranks, errors.py what launch refuses with.

The names below are the public ones (``from npudist.launch import plan, LaunchError``), loaded on first use
so that ``npudist launch --help`` (options.py) imports neither torch nor the plan; the old module paths
(``npudist.launch_options`` ...) are aliases of the modules here (npudist/__init__.py).
"""

from __future__ import annotations

from types import MappingProxyType

from npudist._lazy import exports, listing

_WHERE = MappingProxyType({
    "ONE_DEVICE_PER_RANK": "npudist.launch.devices",
    "resolve_nproc": "npudist.launch.devices",
    "visible_devices": "npudist.launch.devices",
    "LaunchError": "npudist.launch.errors",
    "USAGE": "npudist.launch.options",
    "parser": "npudist.launch.options",
    "OMP_VAR": "npudist.launch.planner",
    "SHARE_STORE_OPT_OUT": "npudist.launch.planner",
    "LaunchPlan": "npudist.launch.planner",
    "accelerator_for": "npudist.launch.planner",
    "dry_run_steps": "npudist.launch.planner",
    "plan": "npudist.launch.planner",
    "free_port": "npudist.launch.ports",
    "port_in_use": "npudist.launch.ports",
    "run": "npudist.launch.runner",
})

__getattr__ = exports(__name__, _WHERE)
__dir__ = listing(__name__, _WHERE)
__all__ = sorted(_WHERE)
