"""`npudist launch`'s command line: torchrun's parser with npudist's own options, built without importing torch
(torchrun_parser.py), so `npudist launch --help` answers in well under a second."""

from __future__ import annotations

import argparse
from types import MappingProxyType

from npudist.launch.torchrun_parser import torchrun_parser
from npudist.runtime.settings import SIMULATE_MODES

USAGE = "npudist launch [npudist options] [torchrun options] SCRIPT [ARGS...]"
DESCRIPTION = """\
Start SCRIPT on every rank of this node through torchrun, with what torchrun cannot know filled in:
--nproc-per-node defaults to one rank per device of the detected accelerator (2 on a CPU), a single-node
job gets a free --master-port instead of 29500, and --metrics-port/--targets-file give Prometheus the ranks'
endpoints (the file is emptied when the job ends). npudist's own options come first; every other option is
torchrun's, passed through unchanged (https://pytorch.org/docs/stable/elastic/run.html).

examples:
  npudist launch examples/train_ddp.py --steps 100            one rank per device (2 on a CPU)
  npudist launch --simulate npu examples/train_ddp.py         every rank on the simulated Ascend NPU
  npudist launch --dry-run train.py --epochs 90               2 steps and a checkpoint round trip, then exit
  npudist launch --metrics-port 9500 --targets-file runs/t.json --run-dir runs/r train.py
  npudist launch --nnodes 2 --node-rank 0 --master-addr host0 --master-port 29500 train.py
  mpirun -n 8 npudist launch --mpi train.py                   one rank per MPI process"""
_HELP = MappingProxyType({
    "nproc_per_node": "npudist: ranks on this node, a positive integer or auto (default) = one per device of "
                      "the accelerator (NPUDIST_CPU_NPROC, default 2, on a CPU)",
    "training_script": "the training script's path (checked before torchrun starts), then its own arguments",
    "training_script_args": argparse.SUPPRESS,
})


def parser() -> argparse.ArgumentParser:
    """torchrun's parser plus npudist's own options; `--help` lists npudist's first, torchrun's after."""
    p = torchrun_parser()
    p.prog, p.usage, p.description = "npudist launch", USAGE, DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    # Options are matched whole: an abbreviation ("--metrics" for --metrics-port) would be acted on here
    # and still reach torchrun, which reads it its own way or fails on it.
    p.allow_abbrev = False
    group = p.add_argument_group("npudist options")
    group.add_argument("--accelerator", default=None, metavar="NAME",
                       help="use this accelerator (npu, cuda, mlu, rknpu, cpu) instead of detecting one; "
                       "the ranks get NPUDIST_ACCELERATOR=NAME")
    group.add_argument("--mpi", action="store_true",
                       help="run the script directly as the rank that mpirun/srun started (no torchrun agent)")
    group.add_argument("--metrics-port", type=int, default=None,
                       help="each rank serves Prometheus metrics on this port + its local rank")
    group.add_argument("--run-dir", default=None, metavar="DIR",
                       help="the job's run directory: each rank writes its run log (DIR/metrics/rank{R}.jsonl, "
                       "for `npudist report DIR`) and hang reports there; the ranks get NPUDIST_RUN_DIR=DIR")
    group.add_argument("--tensorboard", default=None, metavar="DIR",
                       help="rank 0 also writes TensorBoard event files of the loop's numbers (loss, samples/s, "
                       "npudist.log) to DIR; needs the tensorboard package: pip install 'npudist[tensorboard]'")
    group.add_argument("--targets-file", default=None,
                       help="write a Prometheus file_sd JSON file listing the ranks' metrics endpoints while "
                       "they run; emptied ([]) on exit, Ctrl-C and SIGTERM")
    group.add_argument("--dry-run", nargs="?", const="2", default=None, metavar="N",
                       help="run the script for N optimizer steps (default 2), save a checkpoint of what the "
                       "optimizer trains and load it back on every rank, then exit: a check of the loop, "
                       "device, collectives and checkpoints before a long job")
    group.add_argument("--simulate", default=None, metavar="|".join(SIMULATE_MODES),
                       help="run every rank on the simulated Ascend NPU (npudist.sim) with a simulated hccl; "
                       "npu:strict also enforces the hccl-strict rules. `import torch_npu` loads the simulation")
    group.add_argument("--peer-snapshots", type=int, default=None, metavar="K",
                       help="every K steps each rank's state is copied to the host memory of a rank on another "
                       "node (this node's holder runs in this process and outlives worker restarts); a "
                       "restart resumes from the freshest verified copy, else from disk")
    group.add_argument("--peer-snapshot-bind", default=None, metavar="HOST",
                       help="address this node's snapshot holder listens on (default: 127.0.0.1 on one node; "
                       "over several nodes, this node's address on the interface that routes to the master)")
    for action in p._actions:  # torchrun's text offers gpu/cpu/xpu, which npudist answers itself
        action.help = _HELP.get(action.dest, action.help)
    p._optionals.title = "torchrun options (passed through to torchrun)"
    p._positionals.title = "script"
    # Help order: npudist's options, then the script, then torchrun's.
    p._action_groups[:] = [group, p._positionals, *[g for g in p._action_groups if g not in (group, p._positionals)]]
    return p
