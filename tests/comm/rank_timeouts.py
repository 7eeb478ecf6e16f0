"""One rank of a 2-rank gloo job whose rank 1 may run with another HCCL_EXEC_TIMEOUT (argv[1], or - for none):
rank 0's watchdog compares the ranks' timeouts once at start (comm/hang/agree.py); rank 0 waits for that, then
both ranks meet in one all_reduce and shut down."""

import os
import sys
import time

if os.environ["RANK"] == "1" and sys.argv[1] != "-":
    os.environ["HCCL_EXEC_TIMEOUT"] = sys.argv[1]

import torch

import npudist
from npudist.comm.state import state

npudist.init(backend="gloo")
watchdog = state().watchdog
deadline = time.monotonic() + 20
while watchdog.agree is not None and time.monotonic() < deadline:  # rank 0's comparison pending
    time.sleep(0.05)
npudist.all_reduce(torch.ones(1))
npudist.shutdown()
