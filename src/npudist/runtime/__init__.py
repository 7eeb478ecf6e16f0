"""This process's npudist runtime: settings, rank layout from any launcher, the Runtime that owns its state.

The ground layer: it imports nothing of npudist outside ``runtime/`` (tests/test_layers.py), so every
other package can reach the Runtime. ``init()``/``shutdown()``, which need the accelerators and comm,
live above them in ``npudist.lifecycle``. Names load on first use (as in ``npudist``), so
``npudist.runtime.settings`` and ``.env`` are readable without torch.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from npudist._lazy import exports, listing

if TYPE_CHECKING:
    from npudist.runtime.env import EnvError, RankInfo, rank_info, torchrun_env
    from npudist.runtime.settings import Settings, SettingsError
    from npudist.runtime.state import Runtime, current

_WHERE = MappingProxyType({
    "EnvError": "npudist.runtime.env",
    "RankInfo": "npudist.runtime.env",
    "rank_info": "npudist.runtime.env",
    "torchrun_env": "npudist.runtime.env",
    "Settings": "npudist.runtime.settings",
    "SettingsError": "npudist.runtime.settings",
    "Runtime": "npudist.runtime.state",
    "current": "npudist.runtime.state",
})

__all__ = [
    "EnvError",
    "RankInfo",
    "Runtime",
    "Settings",
    "SettingsError",
    "current",
    "rank_info",
    "torchrun_env",
]


__getattr__ = exports(__name__, _WHERE)
__dir__ = listing(__name__, _WHERE)
