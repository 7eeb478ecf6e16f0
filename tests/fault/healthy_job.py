"""A healthy 2-rank training job with one long phase on one rank, written the way public scripts write it.

The patterns come from nanoGPT's train.py (karpathy/nanoGPT, MIT): only the master process evaluates
(``if iter_num % eval_interval == 0 and master_process: losses = estimate_loss()``) and writes the checkpoint
(``torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt'))``) while the other ranks go on into the next
step's gradient all_reduce; from Hugging Face scripts (``main_process_first``): one rank prepares data while
the others wait at ``torch.distributed.barrier()``; and from pytorch/examples (a ``DataLoader`` with workers
feeding the step). Nothing here tells npudist that the phase is expected: it must tell busy from hung.

    npudist launch --nproc-per-node 2 tests/fault/healthy_job.py PATTERN SECONDS OUT_DIR

PATTERN: eval-ddp, eval-barrier, checkpoint, start, loader. Prints ``DONE <pattern> step=<n>`` at the end.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import npudist

PATTERN, SECONDS, OUT = sys.argv[1], float(sys.argv[2]), sys.argv[3]
STEPS, AT = 12, 4  # the long phase comes at step AT, after the job has learnt its step time


class Batches(Dataset):
    """Random regression batches; with ``slow_at`` one item takes SECONDS to make (a slow storage read)."""

    def __init__(self, rank: int, slow_at: int | None) -> None:
        self.rank, self.slow_at = rank, slow_at

    def __len__(self) -> int:
        return STEPS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == self.slow_at:
            time.sleep(SECONDS)
        g = torch.Generator().manual_seed(1000 * self.rank + i)
        x = torch.randn(32, 64, generator=g)
        return x, x.sum(dim=1, keepdim=True)


def busy_python(seconds: float, model: nn.Module) -> None:
    """Evaluation as nanoGPT's estimate_loss does it: forward passes under no_grad, on the CPU, for a while."""
    model.eval()
    end = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < end:
            model(torch.randn(256, 64)).sum().item()
    model.train()


def main() -> None:
    ctx = npudist.init()
    npudist.comm.set_run_dir(OUT)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    if PATTERN == "start" and ctx.rank == 1:
        busy_python(SECONDS, model)  # compiling / tokenising before the first collective
    model = npudist.ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Batches(ctx.rank, AT if PATTERN == "loader" and ctx.rank == 1 else None), batch_size=None,
                        num_workers=1 if PATTERN == "loader" else 0)
    step = 0
    for step, (x, y) in enumerate(loader, start=1):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step != AT:
            continue
        if ctx.rank == 0 and PATTERN in ("eval-ddp", "eval-barrier"):
            busy_python(SECONDS, model.module)
        elif ctx.rank == 0 and PATTERN == "checkpoint":
            state = {"model": model.module.state_dict(), "pad": torch.randn(64 * 1024 * 1024)}  # 256 MiB
            end = time.monotonic() + SECONDS
            while time.monotonic() < end:  # one large synchronous checkpoint on a slow disk
                torch.save(state, os.path.join(OUT, "ckpt.pt"))
        if PATTERN == "eval-barrier":  # the others wait here, in torch's own barrier
            dist.barrier()
    print(f"DONE {PATTERN} rank={ctx.rank} step={step}", flush=True)
    npudist.shutdown()


if __name__ == "__main__":
    main()
