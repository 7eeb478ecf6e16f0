"""Run as one rank: the user tears the group down with dist.destroy_process_group(), not npudist.shutdown().

npudist must still let go of the group and its threads before the interpreter finalizes. The check runs
from an atexit handler registered before npudist is imported, so it runs after npudist's own handlers.
"""

import atexit
import json
import os
import threading
from pathlib import Path


def _threads_left() -> None:
    tasks = Path("/proc/self/task")
    names = [(t / "comm").read_text().strip() for t in tasks.iterdir()] if tasks.is_dir() else []
    left = [n for n in names if "gloo" in n] + [t.name for t in threading.enumerate() if t.name.startswith("npudist")]
    with open(os.path.join(os.environ["PROBE_OUT"], f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps({"rank": int(os.environ["RANK"]), "threads_at_exit": sorted(left)}) + "\n")


atexit.register(_threads_left)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import npudist  # noqa: E402
from npudist import comm  # noqa: E402

npudist.init()
comm.set_profile("hccl-strict")
comm.all_reduce(torch.ones(1000, dtype=torch.bfloat16))  # adapted: caches the group, starts the watchdog
dist.barrier()
dist.destroy_process_group()
