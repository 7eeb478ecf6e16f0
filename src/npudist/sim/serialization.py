"""``torch.load(..., map_location="npu:0")`` on the simulated NPU.

Simulated tensors live in host memory and have no PrivateUse1 storage, so a storage cannot be moved to
``npu`` (torch's own path allocates one and crashes). The checkpoint is restored into host memory
instead: ``load_state_dict`` copies it into the simulated parameters, as torch_npu's copy to the device
would; a loaded tensor used directly stays on the CPU and fails loudly on the first mixed-device op.
"""

from __future__ import annotations

from typing import Any

import torch

from npudist.sim.tensor import DEVICE_TYPE

_PRIORITY = 1
"""Before torch's own handlers (cpu is 10, the PrivateUse1 one later): torch/serialization.py::register_package."""


def _restore(storage: Any, location: str) -> Any:
    return storage if location.split(":")[0] == DEVICE_TYPE else None


def _tag(storage: Any) -> None:
    return None  # saving goes through torch's own taggers


def register() -> None:
    torch.serialization.register_package(_PRIORITY, _tag, _restore)
