"""One rank with everything a rank starts: run-dir lock, metrics server and device poller, run log, an
asynchronous checkpoint. Then npudist.shutdown() alone (the script closes nothing itself), and a record of
what is left: npudist threads, the metrics port, the lock. argv: OUT RUN_DIR."""

import json
import os
import socket
import sys
import threading
import urllib.request
from pathlib import Path

import torch

import npudist
import npudist.telemetry
from npudist import checkpoint
from npudist.checkpoint.lock import LOCK_FILE
from npudist.telemetry.job.run_log import open_run_log


def npudist_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("npudist"))


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) == 0


out, run_dir = Path(sys.argv[1]), sys.argv[2]
ctx = npudist.init()
checkpoint.lock_run_dir(run_dir)
telemetry = npudist.telemetry.serve_rank_metrics(ctx)
timer = telemetry.step_timer(exchange_every=2)
runlog = open_run_log(run_dir, ctx, telemetry, timer)
timer.step()
for step in range(1, 5):
    npudist.all_reduce(torch.ones(8))
    runlog.step(step, 1.0 / step, timer.step())
checkpoint.save({"w": torch.ones(4)}, run_dir, 4, async_save=True)
server = telemetry.server
with urllib.request.urlopen(server.url, timeout=10) as reply:
    served = reply.status == 200 and b"npudist_steps_total" in reply.read()
before = {"threads": npudist_threads(), "port_open": port_open(server.host, server.port), "served": served,
          "poller": telemetry.poller is not None}
npudist.shutdown()
lock_text = (Path(run_dir) / LOCK_FILE).read_text() if ctx.rank == 0 else ""
after = {"threads": npudist_threads(), "port_open": port_open(server.host, server.port),
         "lock_text": lock_text, "runlog_last": json.loads(Path(runlog.path).read_text().splitlines()[-1])["kind"]}
(out / f"rank{ctx.rank}.json").write_text(json.dumps({"before": before, "after": after, "pid": os.getpid()}))
