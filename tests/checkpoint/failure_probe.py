"""Two ranks meet real write failures and a bad run-dir lock, and go on: each rank writes what it saw.

argv: OUT_DIR RUN_DIR MODE. MODE "rlimit": rank 0 runs under RLIMIT_FSIZE (EFBIG past the limit);
MODE "full": RUN_DIR is on a small filesystem that a large save fills (ENOSPC).
"""

import json
import os
import resource
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import npudist
from npudist import checkpoint
from npudist.checkpoint.lock import LOCK_FILE

out_dir, run_dir, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
ctx = npudist.init()
seen: dict = {"rank": ctx.rank}


def attempt(name, call):
    try:
        call()
        seen[name] = "no error"
    except Exception as exc:
        seen[name] = f"{type(exc).__name__}: {exc}"


def limit_file_size(on: bool) -> None:
    if mode == "rlimit" and ctx.rank == 0:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the default kill
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10 if on else hard, hard))


# A lock file that is a symlink, then one with an absurd holder record: named errors or a takeover,
# on every rank, and no rank left waiting for rank 0.
locks = out_dir / "locks"
if ctx.rank == 0:
    (locks / "linked").mkdir(parents=True)
    (locks / "linked" / LOCK_FILE).symlink_to(out_dir / "victim.txt")
    (locks / "hostile").mkdir()
    (locks / "hostile" / LOCK_FILE).write_text('{"host": "h", "pid": 1e999, "started": "x"}')
dist.barrier()
attempt("symlinked_lock", lambda: checkpoint.lock_run_dir(locks / "linked"))
attempt("hostile_lock", lambda: checkpoint.lock_run_dir(locks / "hostile"))

checkpoint.save({"w": torch.ones(4)}, run_dir, 1)
limit_file_size(True)
attempt("sync", lambda: checkpoint.save({"w": torch.ones(1 << 20)}, run_dir, 2))
seen["tmp_after_sync"] = sorted(p.name for p in run_dir.iterdir() if p.name.startswith("."))
if ctx.rank == 0:  # plain async saves: rank 0 writes, and raises its own failure
    handle = checkpoint.save({"w": torch.ones(1 << 20)}, run_dir, 3, async_save=True)
    attempt("async", handle.wait)
    seen["tmp_after_async"] = sorted(p.name for p in run_dir.iterdir() if p.name.startswith("."))
limit_file_size(False)

# The job goes on: collectives pair up, and the next save (small enough to fit) works.
total = torch.ones(1)
dist.all_reduce(total)
seen["all_reduce"] = total.item()
attempt("after", lambda: checkpoint.save({"w": torch.full((4,), 4.0)}, run_dir, 4, keep=1))
seen["checkpoints"] = checkpoint.list_checkpoints(run_dir)
seen["victim_exists"] = os.path.lexists(out_dir / "victim.txt")
(out_dir / f"rank{ctx.rank}.json").write_text(json.dumps(seen))
npudist.shutdown()
