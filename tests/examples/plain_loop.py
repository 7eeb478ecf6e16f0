"""A training loop as people write one, with nothing of npudist's but init() and ddp(): a DataLoader over a
DistributedSampler, an optimizer, epochs. tests/examples/test_plain_loop.py runs it under `npudist launch`."""

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import npudist

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--step-ms", type=float, default=0.0, help="each step also takes this long (a slower model)")
p.add_argument("--samples", type=int, default=256)
p.add_argument("--slow-data-rank", type=int, default=-1, help="this rank's batches take --slow-data-ms longer")
p.add_argument("--slow-data-ms", type=float, default=0.0)
args = p.parse_args()



class SlowDataset(torch.utils.data.Dataset):
    def __init__(self, inner, seconds):
        self.inner, self.seconds = inner, seconds

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return self.inner[i]


ctx = npudist.init()
torch.manual_seed(0)
model = npudist.ddp(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
data = TensorDataset(torch.randn(args.samples, 8), torch.randn(args.samples, 1))
if ctx.rank == args.slow_data_rank:  # a slow disk or decoder on one node: each sample takes a while
    data = SlowDataset(data, args.slow_data_ms / 1000 / 8)
sampler = DistributedSampler(data, num_replicas=ctx.world_size, rank=ctx.rank, seed=0)
loader = DataLoader(data, batch_size=8, sampler=sampler)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        time.sleep(args.step_ms / 1000)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
