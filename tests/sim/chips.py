"""Which device a rank's tensors are on under the simulation started by a test: ``npu:<local rank>`` where the
simulated NPU's C++ device guard builds (sim/guard.py), ``npu:0`` for every rank without it."""

from __future__ import annotations

import functools


@functools.cache
def separate() -> bool:
    from npudist.sim import guard

    return guard.build()[0] is not None


def device(local_rank: int) -> str:
    return f"npu:{local_rank if separate() else 0}"
