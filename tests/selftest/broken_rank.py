"""Ranks of `npudist test` with things broken on purpose, to prove the checks notice: BROKEN (a test's
variable, read here and never by npudist) lists what to break, comma-separated.

all_gather: the gathered rows come back in reverse rank order. checkpoint: rank 0 flips a byte of the
state file just after the save is published, so the load finds its checksum wrong.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from npudist import checkpoint, comm
from npudist.selftest import rank

BROKEN = set(os.environ.get("BROKEN", "").split(","))
real_gather, real_save = comm.all_gather, checkpoint.save


def reversed_gather(t, *args, **kw):
    return real_gather(t, *args, **kw).flip(0)


def corrupting_save(state, directory, step, **kw):
    real_save(state, directory, step, **kw)
    if rank.rank_info(os.environ).rank == 0:
        victim = max(Path(directory).rglob("*.pt"), key=lambda p: p.stat().st_size)
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    comm.all_reduce(torch.zeros(1))  # the other ranks load only after the damage is done


if "all_gather" in BROKEN:
    comm.all_gather = reversed_gather
if "checkpoint" in BROKEN:
    checkpoint.save = corrupting_save

if __name__ == "__main__":
    sys.exit(rank.main())
