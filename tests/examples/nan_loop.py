"""A plain loop (init, ddp, DataLoader, optimizer, a checkpoint every few steps) with an inf in one rank's batch
at one step, with or without a GradScaler. tests/examples/test_nan_sentinel.py runs it under `npudist launch`."""

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import npudist
from npudist import checkpoint

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--inf-rank", type=int, default=1)
p.add_argument("--inf-step", type=int, default=30)
p.add_argument("--checkpoint-every", type=int, default=10)
p.add_argument("--run-dir", required=True)
p.add_argument("--grad-scaler", action="store_true")
p.add_argument("--save-on-stop", action="store_true", help="catch the stop and try to save (it is refused)")
args = p.parse_args()

ctx = npudist.init()
torch.manual_seed(0)
model = npudist.ddp(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
per_rank = 8 * args.steps
data = TensorDataset(torch.randn(per_rank * ctx.world_size, 8), torch.randn(per_rank * ctx.world_size, 1))
sampler = DistributedSampler(data, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=False)
loader = DataLoader(data, batch_size=8, sampler=sampler)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cpu") if args.grad_scaler else None
step = 0
for x, y in loader:
    step += 1
    if step == args.inf_step and ctx.rank == args.inf_rank:
        x = x.clone()
        x[0, 0] = float("inf")
    loss = F.mse_loss(model(x), y)
    opt.zero_grad()
    try:
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    except npudist.NonFiniteError:
        if args.save_on_stop:
            try:
                checkpoint.save({"model": model.state_dict()}, args.run_dir, step)
            except checkpoint.CheckpointError as exc:
                print(f"rank={ctx.rank} save refused: {exc}", flush=True)
        raise
    if step % args.checkpoint_every == 0:
        checkpoint.save({"model": model.state_dict(), "step": step}, args.run_dir, step)
finite = all(p.isfinite().all() for p in model.parameters())
# One write per line: the two ranks share the launcher's stdout, and print's separate newline could interleave.
sys.stdout.write(f"rank={ctx.rank} trained to step={step} params_finite={finite}\n")
sys.stdout.flush()
