"""Which chips a process of the simulated NPU sees, as the CANN runtime decides it: ``ASCEND_RT_VISIBLE_DEVICES``,
else the host's chips; and a device argument read as an index among them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from npudist.sim.state import SIM
from npudist.sim.tensor import DEVICE_TYPE

VISIBLE_VAR = "ASCEND_RT_VISIBLE_DEVICES"
"""The CANN runtime's visible-devices variable (CANN "Environment Variables" reference)."""


class SimDeviceError(RuntimeError):
    """A device call the simulated NPU cannot honour, in torch_npu's words where it has them."""


def physical_chip(env: Mapping[str, str] | None = None, chips: int = 8) -> int:
    """The chip this process's ``npu:0`` stands for.

    ``ASCEND_RT_VISIBLE_DEVICES`` with one entry names the chip; with several (a node-wide list, as a
    launcher without per-rank lists sets it) the entry at LOCAL_RANK is this rank's; unset, the chip is
    LOCAL_RANK. A chip the simulated host does not have is an error, as on a real host.
    """
    env = os.environ if env is None else env
    local_rank = int(env.get("LOCAL_RANK", "0") or 0)
    listed = [c.strip() for c in env.get(VISIBLE_VAR, "").split(",") if c.strip()]
    if not listed:
        chip = local_rank
    elif len(listed) == 1:
        chip = chip_number(listed[0])
    elif local_rank < len(listed):
        chip = chip_number(listed[local_rank])
    else:
        raise SimDeviceError(f"{VISIBLE_VAR}={env.get(VISIBLE_VAR)!r} lists {len(listed)} chips but this is "
                             f"local rank {local_rank}")
    if not 0 <= chip < chips:
        raise SimDeviceError(f"chip {chip} does not exist: the simulated host has {chips} (0-{chips - 1})")
    return chip


def chip_number(text: str) -> int:
    if not text.isdigit():
        raise SimDeviceError(f"{VISIBLE_VAR} entry {text!r} is not a chip number")
    return int(text)


def device_index(device: Any) -> int:
    if device is None:
        return 0
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != DEVICE_TYPE:
            raise SimDeviceError(f"expected an {DEVICE_TYPE} device, got {device}")
        return 0 if device.index is None else device.index
    return int(device)


def visible_count(env: Mapping[str, str] | None = None, chips: int | None = None) -> int:
    """The devices ``torch.npu.device_count()`` reports: the visible list, else every chip of the host
    (``chips``: the installed simulation's, NPUDIST_SIM_CHIPS, 8 by default), as the CANN runtime reports."""
    env = os.environ if env is None else env
    listed = [c for c in env.get(VISIBLE_VAR, "").split(",") if c.strip()]
    if listed:
        return len(listed)
    return SIM.chips if chips is None else chips


def check_index(index: int) -> int:
    count = visible_count()
    if not 0 <= index < count:
        # torch_npu's own refusal of an index beyond the visible devices.
        raise SimDeviceError(f"Invalid device ID {index}: this process sees {count} simulated NPU device(s) "
                             f"({VISIBLE_VAR}, else the host's chips); index 0-{count - 1}")
    return index
