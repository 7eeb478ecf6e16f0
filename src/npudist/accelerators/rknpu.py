"""Rockchip RK3588 board detection: torch has no device for it, so look for the kernel driver."""

from __future__ import annotations

import glob
import importlib.util
import os

from npudist.runtime.settings import Settings

# Places the rknpu kernel driver shows itself (Rockchip rknpu driver 0.9.x; devfreq device name
# differs by SoC: fdab0000.npu on RK3588, 27700000.npu on RK3576, hence the glob).
_MARKERS = ("sys/module/rknpu", "sys/kernel/debug/rknpu", "sys/class/devfreq/*.npu", "sys/class/npu/npu*")


def sysfs_root() -> str:
    """Root under which /sys is read (Settings.sysfs_root: NPUDIST_SYSFS_ROOT, tests point it at a fake tree)."""
    return Settings.from_env().sysfs_root


def probe(root: str | None = None) -> str | None:
    """None when an RK NPU driver is present, else the reason it is not."""
    base = root if root is not None else sysfs_root()
    for marker in _MARKERS:
        if glob.glob(os.path.join(base, marker)):
            return None
    return "no Rockchip NPU driver found (none of " + ", ".join("/" + m for m in _MARKERS) + " exists)"


def runtime_available() -> bool:
    """True when the board's inference runtime (rknn-toolkit-lite2's ``rknnlite``) is installed."""
    return importlib.util.find_spec("rknnlite") is not None
