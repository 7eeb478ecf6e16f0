"""Three ranks; rank 2 never arrives at the 5th all_reduce (stuck in its data loader, say)."""

import sys
import time

import torch

import npudist

ctx = npudist.init()
npudist.comm.set_run_dir(sys.argv[1])
t = torch.ones(1000)
for i in range(1, 6):
    if ctx.rank == 2 and i == 5:
        time.sleep(600)  # stuck: the others must not wait for this
    npudist.all_reduce(t)
npudist.shutdown()
