"""all_gather into one flat tensor, on every supported torch.

torch's ``all_gather_into_tensor`` reaches the backend's ``_allgather_base``, which gloo lacks on torch 2.1
("no support for _allgather_base in Gloo process group", measured on 2.1.2); there the list form, whose
outputs are views of the flat tensor, does the same job.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from npudist.runtime import compat

_INTO_TENSOR = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def all_gather_flat(out: torch.Tensor, t: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    """Gather every rank's ``t`` into ``out`` (world * t.numel() elements, rank order)."""
    if not compat.has("gloo_allgather_base") and dist.get_backend(group) == "gloo":
        parts = list(out.reshape(-1).chunk(dist.get_world_size(group)))
        return dist.all_gather(parts, t.reshape(-1), group=group, async_op=async_op)
    return _INTO_TENSOR(out, t, group=group, async_op=async_op)
