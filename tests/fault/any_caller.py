"""Training loops whose collectives never pass through npudist.comm, written the way public scripts write them.

- ``raw``: a loop of ``dist.all_reduce`` on the default group, as torch's own tutorials average a value.
- ``fsdp2``: pytorch/examples' distributed/FSDP2/example.py: ``fully_shard`` on each block then on the root,
  AdamW, a plain loop (its gate on ``torch.accelerator`` left out: CPU ranks).
- ``tp``: pytorch/examples' distributed/tensor_parallelism/tensor_parallel_example.py: a ToyModel whose
  ``in_proj`` is ``ColwiseParallel`` and ``out_proj`` ``RowwiseParallel`` over a 1-D DeviceMesh.
- ``hsdp``: FSDP2 over a 2-D DeviceMesh (``replicate`` x ``shard``), as torchtitan's HSDP does.
- ``subgroups``: default-group all-reduces with, in between, all-reduces on a subgroup of ranks 0 and 1 that
  rank 2 is not in (``dist.new_group``), the pattern of every pipeline or expert-parallel job.

Each calls ``npudist.init()`` once, as a ported script does, and nothing else of npudist but ``npudist.step()``
in the loops that have no optimizer to mark their steps. A fault is planted on
one rank at one step: ``stop`` (SIGSTOP to itself), ``gil SECONDS`` (libc sleep through ctypes.PyDLL, which
keeps the GIL: the process sleeps, its watchdog thread cannot run) or ``busy SECONDS`` (rank 0 evaluates while
the others wait) or ``pause SECONDS`` (SIGSTOP to itself, outside any collective, while rank 0 spends SECONDS
outside any collective too, then sends it SIGCONT: nothing waits on the stopped rank). Prints
``FAULT kind rank=R step=S time=T`` before the fault and ``DONE step=N`` at the end.

    npudist launch --nproc-per-node N tests/fault/any_caller.py KIND --steps S [--fault F --fault-rank R
        --fault-step S --fault-seconds X]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import npudist


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class ToyModel(nn.Module):
    """tensor_parallel_example.py's model."""

    def __init__(self) -> None:
        super().__init__()
        self.in_proj, self.relu, self.out_proj = nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.relu(self.in_proj(x)))


def fault(args: argparse.Namespace, rank: int, step: int) -> None:
    if rank == args.slow_rank:
        time.sleep(args.slow_ms / 1000)  # a slower card: the same extra time every step
    if args.fault == "pause" and rank == 0 != args.fault_rank and step == args.fault_step:
        time.sleep(args.fault_seconds)  # evaluating, say: in no collective while the other rank is stopped
        pid = int(_pause_file().read_text())
        print(f"FAULT resume rank={args.fault_rank} pid={pid} time={time.time():.3f}", flush=True)
        os.kill(pid, signal.SIGCONT)
        return
    if args.fault is None or rank != args.fault_rank or step != args.fault_step:
        return
    print(f"FAULT {args.fault} rank={rank} step={step} time={time.time():.3f}", flush=True)
    if args.fault == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif args.fault == "pause":
        _pause_file().write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    elif args.fault == "gil":
        ctypes.PyDLL(None).sleep(int(args.fault_seconds))  # PyDLL: the GIL stays held for the whole call
    elif args.fault == "busy":
        end = time.monotonic() + args.fault_seconds
        while time.monotonic() < end:
            sum(range(1000))


def _pause_file() -> Path:
    return Path(os.environ.get("NPUDIST_RUN_DIR", ".")) / "paused.pid"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["raw", "fsdp2", "tp", "hsdp", "subgroups"])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--fault", choices=["stop", "gil", "busy", "pause"])
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=20)
    p.add_argument("--fault-seconds", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=None, help="this rank waits --slow-ms more every step")
    p.add_argument("--slow-ms", type=float, default=0.0)
    args = p.parse_args()
    device = npudist.init().device  # cpu, or npu:<local rank> under --simulate npu (as a ported script runs)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    if args.kind in ("raw", "subgroups"):
        sub = dist.new_group([0, 1]) if args.kind == "subgroups" else None
        for step in range(args.steps):
            fault(args, rank, step)
            t = torch.full((256,), float(rank + step), device=device)
            dist.all_reduce(t)
            if sub is not None and rank in (0, 1):
                dist.all_reduce(t, group=sub)
                dist.all_reduce(t, group=sub)
            time.sleep(0.01)
            npudist.step()  # no optimizer marks the step here: the one call a loop without one makes
    else:
        from torch.distributed.device_mesh import init_device_mesh

        if args.kind == "tp":
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            mesh = init_device_mesh(device.type, (world,))
            plan = {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()}
            model = parallelize_module(ToyModel().to(device), mesh, plan)
            shape = (20, 10)
        else:
            from torch.distributed.fsdp import fully_shard

            mesh = (init_device_mesh(device.type, (2, world // 2), mesh_dim_names=("replicate", "shard"))
                    if args.kind == "hsdp" else init_device_mesh(device.type, (world,), mesh_dim_names=("shard",)))
            model = nn.Sequential(*[Block(64) for _ in range(3)]).to(device)
            for block in model:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            shape = (8, 64)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(args.steps):
            fault(args, rank, step)
            torch.manual_seed(step)  # TP ranks must see the same input; FSDP ranks may
            x = torch.randn(*shape).to(device)
            model(x).sum().backward()
            optim.step()
            optim.zero_grad()
            time.sleep(0.01)
    print(f"DONE step={args.steps}", flush=True)
    npudist.shutdown()


if __name__ == "__main__":
    main()
