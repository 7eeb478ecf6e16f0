# after torchft/train_ddp.py (pytorch/torchft examples)
import os
import time
from datetime import timedelta

import torch
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

print("imported", flush=True)
rg = int(os.environ["REPLICA_GROUP_ID"])
steps = int(os.environ.get("STEPS", "20"))
torch.manual_seed(0)
m = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(m.parameters(), lr=0.01)


def load_state_dict(sd):
    m.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])


def state_dict():
    return {"model": m.state_dict(), "optim": opt.state_dict()}


pg = ProcessGroupGloo(timeout=timedelta(seconds=10))
mgr = Manager(
    pg=pg,
    min_replica_size=1,
    load_state_dict=load_state_dict,
    state_dict=state_dict,
    replica_id=f"rg{rg}",
    timeout=timedelta(seconds=10),
)
print("manager up", flush=True)
m = DistributedDataParallel(mgr, m)
o = Optimizer(mgr, opt)
t0 = time.time()
while mgr.current_step() < steps:
    x = torch.randn(32, 64)
    o.zero_grad()
    m(x).sum().backward()
    o.step()
    print(
        f"rg{rg} step {mgr.current_step()} participants {mgr.num_participants()} t={time.time() - t0:.2f}", flush=True
    )
    if rg == 1 and os.environ.get("DIE") and mgr.current_step() == 5:
        os._exit(9)
    time.sleep(0.2)
print("done", rg, flush=True)
