"""The MTTR table: node-level faults on an elastic job in a namespace cluster (root, iproute2).

    sudo python benchmarks/cluster_mttr.py                       # every fault, 1 trial, 2 nodes x 2 ranks
    sudo python benchmarks/cluster_mttr.py --faults kill_node partition --trials 3

Each trial builds 2 nodes in network namespaces (npudist.testing.cluster), starts examples/train_ddp.py on
both with ``npudist launch --nnodes 1:2`` (c10d rendezvous, 3 restarts, a checkpoint every 5 steps), applies
one fault to node1 after 10 steps and times node 0 until a step runs again (npudist.testing.mttr).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from npudist.runtime.network import IFNAME_VARS  # noqa: E402
from npudist.testing.cluster import unavailable  # noqa: E402
from npudist.testing.mttr import FAULTS, run_trial, table  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--observe", type=float, default=120.0, help="seconds to watch after each fault")
    args = p.parse_args()
    reason = unavailable()
    if reason:
        print(f"cluster_mttr: cannot build a cluster here: {reason}", file=sys.stderr)
        return 2
    env = {k: v for k, v in os.environ.items() if k not in IFNAME_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    trials = []
    for fault in args.faults:
        for _ in range(args.trials):
            t = run_trial(fault, str(REPO / "examples" / "train_ddp.py"), observe_s=args.observe, env=env)
            print(t, file=sys.stderr, flush=True)
            trials.append(t)
    print(table(trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())
