"""One rank of test_pg_watch.py: issues a known number of collectives on known groups, through every door torch
has (the Python API, functional collectives, DDP's reducer, FSDP2), and prints what the watch counted after each.

    npudist launch --nproc-per-node 2 tests/comm/rank_pg_watch.py
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import npudist
from npudist.comm import pg_watch


def counts() -> dict[str, list[int]]:
    snap = pg_watch.snapshot()
    return {g.name: [g.entered, g.done, g.p2p_entered, g.p2p_done] for g in snap.groups}


def main() -> None:
    npudist.init()
    rank = dist.get_rank()
    seen = {"loaded": pg_watch.load(), "start": counts()}
    t = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(t)
    seen["raw"] = counts()
    sub = dist.new_group([0, 1])
    dist.all_reduce(t, group=sub)
    dist.all_reduce(t, group=sub)
    seen["subgroup"] = counts()
    seen["subgroup_name"] = dist.distributed_c10d._get_process_group_name(sub)
    funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD))
    seen["funcol"] = counts()
    if rank == 0:
        dist.send(torch.ones(1), 1)
    else:
        dist.recv(torch.ones(1), 0)
    seen["p2p"] = counts()
    npudist.comm.all_reduce(torch.ones(4))  # npudist's own door: counted once, by the watch
    seen["npudist"] = counts()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    before = counts()
    model(torch.randn(2, 4)).sum().backward()  # one bucket: one all_reduce from DDP's C++ reducer
    seen["ddp_step"] = [before, counts()]
    dist.barrier()
    sys.stdout.write("COUNTS " + json.dumps(seen) + "\n")  # one write: the two ranks share the pipe
    sys.stdout.flush()
    npudist.shutdown()


if __name__ == "__main__":
    main()
