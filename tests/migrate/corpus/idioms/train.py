"""Common CUDA idioms in one DDP script (torchrun style), for `npudist migrate fix` to port."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", type=int, default=None)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--ckpt", default="ckpt.pt")
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", init_method="env://", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    device = torch.device("cuda", local_rank)
    args.gpu = local_rank
    if dist.get_rank() == 0 and torch.cuda.is_available():
        print("device:", torch.cuda.get_device_properties(device).name)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).cuda()
    criterion = nn.CrossEntropyLoss().cuda(args.gpu)
    ddp_kwargs = {"find_unused_parameters": False}
    model = DDP(model, device_ids=[local_rank], output_device=local_rank, **ddp_kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = torch.cuda.amp.GradScaler(enabled=args.amp)
    torch.manual_seed(0)
    x = torch.randn(64, 8).cuda()
    y = (x[:, 0] > 0).long().cuda(non_blocking=True)
    bias = torch.zeros(2, device="cuda")
    losses = []
    for _ in range(30):
        with torch.cuda.amp.autocast(args.amp):
            loss = criterion(model(x) + bias, y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    total = torch.tensor([losses[-1]]).to(local_rank)
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), args.ckpt)
    dist.barrier()
    state = torch.load(args.ckpt, map_location=f"cuda:{local_rank}")
    loc = "cuda:{}".format(args.gpu)
    state = torch.load(args.ckpt, map_location=loc)
    model.module.load_state_dict(state)
    where = "cuda" if torch.cuda.is_available() else "cpu"
    probe = torch.ones(1, device=where)
    print(f"rank {dist.get_rank()} first {losses[0]:.3f} last {losses[-1]:.3f} sum {total.item():.3f} "
          f"probe {probe.device.type == device.type}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
