"""Mixed precision, event timing and allocator statistics in one DDP script, written the way the PyTorch AMP
recipe ("Automatic Mixed Precision") and the CUDA semantics notes (timing with torch.cuda.Event) do, for
`npudist migrate fix` to port."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    model = DDP(model.cuda(), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler(enabled=True)
    torch.manual_seed(rank)  # each rank its own batch
    x = (torch.randn(32, 8) + 3 * rank).cuda()
    y = (x[:, 0] > 3 * rank).long().cuda()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=True):
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    end.record()
    torch.cuda.synchronize()
    with torch.cuda.amp.autocast(enabled=True, dtype=torch.bfloat16):
        probe = model.module[0](x)
    print(f"rank {rank} autocast {out.dtype} {probe.dtype} loss {loss.float().dtype} "
          f"ms {start.elapsed_time(end):.3f} "
          f"allocated {torch.cuda.memory_allocated()} peak {torch.cuda.max_memory_allocated()} "
          f"reserved {torch.cuda.memory_reserved()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
