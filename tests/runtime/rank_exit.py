"""Run as one rank: after teardown no gloo or npudist thread may be left to run into interpreter exit.

Such a thread aborts the process ("terminate called without an active exception", see npudist.shutdown).
``shutdown``: npudist.shutdown(), checked right after it. ``destroy``: the user's own
dist.destroy_process_group(), checked from an atexit handler registered before npudist is imported, so it
runs after npudist's own exit handlers.
"""

import atexit
import json
import os
import sys
import threading
from pathlib import Path


def _emit_lingering_threads() -> None:
    tasks = Path("/proc/self/task")
    names = [(t / "comm").read_text().strip() for t in tasks.iterdir()] if tasks.is_dir() else []
    left = [n for n in names if "gloo" in n] + [t.name for t in threading.enumerate() if t.name.startswith("npudist")]
    with open(os.path.join(os.environ["PROBE_OUT"], f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps({"rank": int(os.environ["RANK"]), "threads_left": sorted(left)}) + "\n")


mode = sys.argv[1]
if mode == "destroy":
    atexit.register(_emit_lingering_threads)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import npudist  # noqa: E402
from npudist import comm  # noqa: E402

npudist.init()
comm.set_profile("hccl-strict")
comm.all_reduce(torch.ones(1000, dtype=torch.bfloat16))  # adapted: caches the group, starts the watchdog
dist.barrier()
if mode == "shutdown":
    npudist.shutdown()
    _emit_lingering_threads()
else:
    dist.destroy_process_group()
