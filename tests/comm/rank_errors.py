"""Runs inside each rank: provokes one error case and prints what happened as one JSON line."""

from __future__ import annotations

import json
import sys
import time

import torch

import npudist
from npudist import comm


def local_errors() -> dict[str, str]:
    """Errors raised before any communication: same on every rank, so nothing hangs."""
    out = {}
    for name, call in {
        "band_float": lambda: comm.all_reduce(torch.ones(4), op="band"),
        "strict_int": lambda: (comm.set_profile("hccl-strict"),
                               comm.all_reduce(torch.ones(4, dtype=torch.int32))),
        "bad_op": lambda: comm.all_reduce(torch.ones(4), op="mean"),
        "rs_shape": lambda: comm.reduce_scatter(torch.ones(3, 2)),
        "not_tensor": lambda: comm.broadcast([1, 2, 3]),
    }.items():
        comm.set_profile(None)
        try:
            call()
            out[name] = "no error"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    comm.set_profile(None)
    return out


def main() -> None:
    mode = sys.argv[1]
    ctx = npudist.init()
    report: dict = {"rank": ctx.rank}
    if mode == "debug":
        report["errors"] = local_errors()
        comm.all_reduce(torch.ones(1))  # the group still works after those errors
        comm.set_debug(True)
    t = torch.ones(10 + 1000 * ctx.rank)
    start = time.monotonic()
    try:
        comm.all_reduce(t)
        report["error"] = "no error"
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    report["seconds"] = time.monotonic() - start
    if len(sys.argv) > 2:  # one file per rank: the ranks share torchrun's stdout and lines interleave
        with open(f"{sys.argv[2]}/rank{ctx.rank}.json", "w") as f:
            json.dump(report, f)
    print("REPORT " + json.dumps(report), flush=True)
    if mode != "mismatch":
        npudist.shutdown()


if __name__ == "__main__":
    main()
