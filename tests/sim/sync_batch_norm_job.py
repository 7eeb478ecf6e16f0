"""Runs in each rank under `npudist launch --simulate npu`: nn.SyncBatchNorm as a user's script calls it.

The reference is plain torch on one process: BatchNorm2d over the whole global batch (every rank's
shard concatenated), which is what SyncBatchNorm promises across ranks. Then the usual recipe, a
conv net through ``nn.SyncBatchNorm.convert_sync_batchnorm`` and DDP (pytorch/examples imagenet's
``--sync-bn`` path), trains a few steps. ``OUT_DIR``: each rank writes OUT_DIR/rank{R}.json.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import npudist

ctx = npudist.init()
device, rank, world = ctx.device, ctx.rank, ctx.world_size
shards = [torch.randn(3, 4, 5, 5, generator=torch.Generator().manual_seed(100 + r)) * (r + 1) for r in range(world)]

# One SyncBatchNorm step against BatchNorm2d over the global batch.
sync = nn.SyncBatchNorm(4).to(device)
x = shards[rank].clone().to(device).requires_grad_(True)
y = sync(x)
(y * y).sum().backward()
ref = nn.BatchNorm2d(4)
whole = torch.cat(shards).requires_grad_(True)
y_ref = ref(whole)
(y_ref * y_ref).sum().backward()
mine = slice(3 * rank, 3 * rank + 3)
grad_w, grad_b = sync.weight.grad.clone(), sync.bias.grad.clone()
dist.all_reduce(grad_w)  # each rank holds its shard's share of the parameter gradients
dist.all_reduce(grad_b)


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().cpu().float() - b.detach().float()).abs().max().item()


result = {"rank": rank, "device": str(x.device), "output": gap(y, y_ref[mine]),
          "input_grad": gap(x.grad, whole.grad[mine]), "running_mean": gap(sync.running_mean, ref.running_mean),
          "running_var": gap(sync.running_var, ref.running_var), "weight_grad": gap(grad_w, ref.weight.grad),
          "bias_grad": gap(grad_b, ref.bias.grad), "scale": whole.detach().abs().max().item()}

# The recipe: convert, wrap in DDP, train.
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                    nn.Flatten(), nn.Linear(8, 2))
net = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(net).to(device))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
losses = []
images = torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(1000 + rank))
labels = (images.mean((1, 2, 3)) > 0).long()  # one batch per rank, learnt over the steps
for _ in range(6):
    loss = nn.functional.cross_entropy(net(images.to(device)), labels.to(device))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
bn = net.module[1]
stats = torch.cat([bn.running_mean, bn.running_var])
gathered = [torch.empty_like(stats) for _ in range(world)]
dist.all_gather(gathered, stats)
result.update(bn_type=type(bn).__name__, losses=losses, running_stats_differ=gap(gathered[0], gathered[-1].cpu()),
              batches_tracked=int(bn.num_batches_tracked))
(Path(sys.argv[1]) / f"rank{rank}.json").write_text(json.dumps(result))
npudist.shutdown()
