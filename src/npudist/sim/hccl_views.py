"""What the simulated hccl group shows torch besides itself: the backend object ``pg._get_backend(npu)``
returns, and the dispatched C++ ProcessGroup its gloo backend is called through (so the process-group watch,
comm/pg_watch.py, counts the simulated collectives as it counts a real HCCL group's)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def dispatched_view(backend: dist.ProcessGroupGloo, store: dist.Store, rank: int, size: int, name: str) -> Any:
    """``backend`` registered on a C++ ProcessGroup for CPU tensors; ``backend`` itself where this torch's
    ProcessGroup cannot be built from Python (its constructor and registration calls are private API)."""
    try:
        view = dist.ProcessGroup(store, rank, size)
        view._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
        view._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        if name:
            view._set_group_name(name)
    except (AttributeError, TypeError, RuntimeError):
        return backend
    return view


class BackendView:
    """What ``pg._get_backend(npu)`` returns for a simulated hccl group: the attributes torch reads from a
    backend object (distributed_c10d: supports_splitting, options, eager connect, sequence numbers, name)."""

    supports_splitting = True  # ProcessGroupHCCL splits (torch_npu); SimHcclGroup.split_group does it here
    supports_coalescing = False
    supports_time_estimate = False
    options = None

    def __init__(self, group: Any) -> None:
        self._group = group

    def name(self) -> str:
        return "hccl"

    def eager_connect_single_device(self, device: Any) -> None:
        return None  # gloo connected when the group was made

    def _set_sequence_number_for_group(self) -> None:
        return None

    def comm_split_count(self) -> int:
        return 0
