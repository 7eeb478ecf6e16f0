"""One rank of a job on ``fakeccl``, a backend registered for the ``fakedev`` device only (tests/fakes/device_only.py).

Runs npudist's own control traffic (the run-dir lock, checkpoint saves, the skew exchange, shutdown) and
writes what it saw, or the error that stopped it, to OUT/rank{R}.json. argv: OUT RUN_DIR BUSY_DIR.
"""

import json
import os
import sys
import traceback
from pathlib import Path

from tests.fakes import device_only

device_only.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import npudist  # noqa: E402
from npudist import checkpoint  # noqa: E402
from npudist.infer import ensemble_predict  # noqa: E402
from npudist.infer.ensemble import gather_floats  # noqa: E402


def control():  # imported when used, so the checkpoint steps also run (and fail) on a tree without the door
    from npudist.comm import control

    return control


out_dir, run_dir, busy_dir = (Path(a) for a in sys.argv[1:4])
rank = int(os.environ["RANK"])
seen: dict = {}
steps = [
    ("busy", lambda: checkpoint.lock_run_dir(busy_dir)),
    ("lock", lambda: checkpoint.lock_run_dir(run_dir) is not None),
    ("save", lambda: str(checkpoint.save({"w": torch.arange(4.0)}, run_dir, 1))),
    ("save_async", lambda: str(checkpoint.save({"w": torch.ones(3)}, run_dir, 2, async_save=True).wait())),
    ("device", lambda: str(control().device())),
    ("any_rank", lambda: control().any_rank(rank == 1)),
    ("from_rank", lambda: control().from_rank(rank == 0)),
    ("gather_rows", lambda: control().gather_rows([float(rank), 0.5])),
    ("ensemble", lambda: ensemble_predict(torch.nn.Linear(4, 3), torch.ones(2, 4), num_classes=3).world_size),
    ("gather_floats", lambda: gather_floats(float(rank))),
    ("shutdown", npudist.shutdown),
]
dist.init_process_group(device_only.BACKEND)
for name, step in steps:
    try:
        seen[name] = {"ok": step()}
    except Exception as exc:  # the test reads which step failed and how
        seen[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
seen["initialized_after"] = dist.is_initialized()
(out_dir / f"rank{rank}.json").write_text(json.dumps(seen))
