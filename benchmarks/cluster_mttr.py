"""The MTTR table: node-level faults on an elastic job in a namespace cluster (root, iproute2, prometheus).

    sudo python benchmarks/cluster_mttr.py                       # every fault and layout, 1 trial
    sudo python benchmarks/cluster_mttr.py --trials 3 --jsonl mttr.jsonl
    sudo python benchmarks/cluster_mttr.py --faults kill_node kill_rank --layouts 2x2 --recovery disk memory \
        --trials 3 --warm-steps 12 --no-prometheus --jsonl recovery.jsonl    # in-memory copies against disk

Each trial builds the nodes in network namespaces (npudist.testing.cluster), each with its own
``npudist exporter``, and a real Prometheus with npudist's rules scraping every node and rank
(npudist.testing.cluster_monitor); starts examples/train_ddp.py on every node with ``npudist launch
--nnodes 1:N`` (c10d rendezvous, 3 restarts, a checkpoint every 5 steps), applies one fault to the last
node after 10 steps and times node 0 until a step runs again, watching for alerts for ``--observe`` s
(npudist.testing.mttr). ``--recovery memory`` adds ``--peer-snapshots K`` (each node's holder on its own
address): a restart then resumes from the freshest in-memory copy that survived instead of the last disk
checkpoint. Trials go round the (layout, fault) pairs, so an interrupted run has every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from npudist.runtime.network import IFNAME_VARS  # noqa: E402
from npudist.testing.cluster import unavailable  # noqa: E402
from npudist.testing.mttr import FAULTS, Trial, run_trial, summary, table  # noqa: E402

LAYOUTS = {"2x2": (2, 2), "4x1": (4, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    p.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--recovery", nargs="+", choices=("disk", "memory"), default=["disk"],
                   help="resume from the disk checkpoints only, or also from in-memory peer snapshots")
    p.add_argument("--peer-snapshots", type=int, default=1, metavar="K", help="with --recovery memory: every K steps")
    p.add_argument("--warm-steps", type=int, default=10,
                   help="steps before the fault (checkpoints every 5: 12 puts the fault mid-interval)")
    p.add_argument("--no-prometheus", action="store_true",
                   help="no Prometheus or alerts: each trial ends at the first step after the restart")
    p.add_argument("--observe", type=float, default=150.0, help="seconds to watch after each fault")
    p.add_argument("--subnet", default=None, help="the cluster's /24 as three octets (default: a free one)")
    p.add_argument("--jsonl", default=None, help="append each trial here as it ends")
    p.add_argument("--table", default=None, metavar="JSONL", help="only print the table of the trials in JSONL")
    p.add_argument("--summary", action="store_true", help="with --table: one row per layout and fault")
    args = p.parse_args()
    if args.table:
        done = [Trial(**json.loads(line)) for line in Path(args.table).read_text().splitlines() if line.strip()]
        done.sort(key=lambda t: (list(LAYOUTS).index(t.layout), FAULTS.index(t.fault)))
        print(summary(done) if args.summary else table(done))
        return 0
    # A kill (timeout, Ctrl-C from a wrapper) unwinds the with-blocks: no namespace or process is left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    reason = unavailable()
    if reason:
        print(f"cluster_mttr: cannot build a cluster here: {reason}", file=sys.stderr)
        return 2
    env = {k: v for k, v in os.environ.items() if k not in IFNAME_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    trials = []
    for _ in range(args.trials):
        for layout in args.layouts:
            nodes, nproc = LAYOUTS[layout]
            for fault in args.faults:
                for recovery in args.recovery:
                    t = run_trial(fault, str(REPO / "examples" / "train_ddp.py"), nodes=nodes, nproc=nproc,
                                  observe_s=args.observe, env=env, subnet=args.subnet, warm_steps=args.warm_steps,
                                  prometheus=not args.no_prometheus,
                                  peer_snapshots=args.peer_snapshots if recovery == "memory" else 0)
                    print(t, file=sys.stderr, flush=True)
                    if args.jsonl:
                        with open(args.jsonl, "a") as f:
                            f.write(json.dumps(dataclasses.asdict(t)) + "\n")
                    trials.append(t)
    trials.sort(key=lambda t: (list(LAYOUTS).index(t.layout), FAULTS.index(t.fault)))
    print(table(trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())
