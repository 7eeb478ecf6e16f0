"""A 2-rank training for the Prometheus integration test: every rank metric gets samples.

Runs until the file argv[1] exists (or 150 s; the ranks agree on when through an all_reduce, so
none is left waiting in a collective). Rank 1 sleeps 0.3 s per step more than rank 0: the straggler.
CPU keeps no allocator statistics, so the ranks report a fixed caching-allocator state
(64 MiB reserved; 56 MiB allocated on rank 0, 40 MiB on rank 1: fragmentation 0.125 and 0.375).
The ranks locate their chips through the fake npu-smi on PATH (`info -m` recording: npu:0 is NPU 3,
npu:1 is NPU 4), so their metrics carry the device/chip labels the node exporter's 8 NPUs have.
Launched with --peer-snapshots, each rank sends its model's state to its partner's holder every K steps, as
examples/train_ddp.py does, so the in-memory copy metrics have samples.
"""

import os
import sys
import time
import types

import torch
from torch import nn

import npudist
import npudist.comm as comm
import npudist.telemetry
from npudist import checkpoint

MIB = 1 << 20


class AllocatorShim:
    def __init__(self, rank: int) -> None:
        self.allocated = (56 if rank == 0 else 40) * MIB

    def memory_stats(self, index=None) -> dict:
        return {"allocated_bytes": self.allocated, "reserved_bytes": 64 * MIB}


ctx = npudist.init()
shim = types.SimpleNamespace(rank=ctx.rank, local_rank=ctx.local_rank, device=ctx.device,
                             accelerator=AllocatorShim(ctx.rank))
tel = npudist.telemetry.serve_rank_metrics(shim, device_source="npu-smi")
timer = tel.step_timer(exchange_every=3, op_every=6)
model = nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.Softmax(-1))
peer = checkpoint.peer_snapshots(ctx.rank, ctx.world_size, ctx.local_world_size)
deadline = time.monotonic() + 150
step = 0
while True:
    step += 1
    stop = torch.tensor([float(os.path.exists(sys.argv[1]) or time.monotonic() > deadline)])
    if comm.all_reduce(stop, op="max").item():
        break
    with timer:
        loss = model(torch.randn(16, 32)).sum()
        loss.backward()
        tel.training_progress(loss=float(loss), samples_per_second=16.0)
        comm.all_reduce(torch.ones(16, 8).t())  # not contiguous: counted as a "contiguous" adaptation
        comm.all_reduce(torch.ones(64), async_op=True).wait()
        time.sleep(0.3 if ctx.rank == 1 else 0.0)
    if peer is not None and peer.due(step):
        peer.snapshot({"model": model.state_dict(), "step": step}, step)
tel.close()
npudist.shutdown()
