"""Two ranks save and reload a sharded checkpoint through torch.distributed.checkpoint, in the loop
and in the background."""

import json
import sys
from pathlib import Path

import torch

import npudist
from npudist import checkpoint

run_dir = Path(sys.argv[1])
ctx = npudist.init()
state = {"w": torch.arange(6, dtype=torch.float32) * 3, "b": torch.ones(2) * 7}
path = checkpoint.save(state, run_dir, 4, sharded=True)
template = {"w": torch.zeros(6), "b": torch.zeros(2)}
loaded, step = checkpoint.load_latest(run_dir, template=template)
result = {"step": step, "w": loaded["w"].tolist(), "b": loaded["b"].tolist(), "writer": path is not None}
# In the background, over DCP's async_save; the copy is taken before save returns.
later = {"w": torch.arange(6, dtype=torch.float32) + 100, "b": torch.ones(2)}
handle = checkpoint.save(later, run_dir, 8, sharded=True, async_save=True)
later["w"].zero_()
handle.wait()
loaded, step = checkpoint.load_latest(run_dir, template={"w": torch.zeros(6), "b": torch.zeros(2)})
result.update(async_step=step, async_w=loaded["w"].tolist())
(run_dir / f"rank{ctx.rank}.json").write_text(json.dumps(result))
npudist.shutdown()
