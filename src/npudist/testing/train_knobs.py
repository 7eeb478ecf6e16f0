"""The faults, slow ranks and holds the tests inject into examples/train_ddp.py, kept out of the example.

The example stays what a user would copy; its command line keeps these flags (checks outside this repository
run it with --slow-rank and --slow-ms), added by ``add_arguments``. Each knob acts on one rank at one place
of a step, and only when its flag is given.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch

import npudist
from npudist.runtime.env import launcher_env

FAULTS = ("sigstop", "sleep", "stall", "skip", "mismatch", "sigkill")
FAULT_SLEEP_S = 3600.0
HOLD_PHASES = ("init", "checkpoint", "resume")


def hold(args: argparse.Namespace, rank: int, phase: str) -> None:
    """--hold-at: this rank stops at ``phase`` until a signal ends it."""
    if args.hold_at == phase and rank == args.hold_rank:
        print(f"HOLD {phase} rank={rank}", flush=True)
        time.sleep(FAULT_SLEEP_S)


def announce(args: argparse.Namespace, rank: int, step: int) -> None:
    """The fault's line, with this rank's last collective as its hang watchdog records it."""
    last = npudist.comm.progress() or {}
    print(f"FAULT {args.fault} rank={rank} step={step} time={time.time():.3f} last={last.get('op')} "
          f"#{last.get('seq')} {last.get('state')} pid={os.getpid()}", flush=True)


def inject(args: argparse.Namespace, step: int, rank: int, where: str) -> None:
    """--fault at its place in the step: ``where`` is start, backward or end; in torchrun's first attempt
    only, so a restarted job runs past the step that failed."""
    if args.fault is None or rank != args.fault_rank or step != args.fault_step:
        return
    if launcher_env(os.environ).restart_count:
        return
    at = {"stall": "start", "sleep": "backward", "sigstop": "end", "sigkill": "end"}.get(args.fault)
    if at != where:
        return
    announce(args, rank, step)
    if args.fault in ("sleep", "stall"):
        time.sleep(FAULT_SLEEP_S)
    else:
        os.kill(os.getpid(), signal.SIGSTOP if args.fault == "sigstop" else signal.SIGKILL)


def loss_average(args: argparse.Namespace, loss: torch.Tensor, step: int, rank: int) -> bool:
    """With --fault, every rank averages the loss every step: the collective skip and mismatch break.

    False: this rank skips it and stops training, as a rank whose data ran out a step early (a rank that
    skipped one call and went on would have gloo abort a peer: "collective mismatch").
    """
    if args.fault is None:
        return True
    value = loss.detach().reshape(1).float()
    if rank == args.fault_rank and step == args.fault_step and args.fault in ("skip", "mismatch"):
        announce(args, rank, step)
        if args.fault == "skip":
            return False
        value = torch.cat([value, value])
    npudist.all_reduce(value, "avg")
    return True


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The testing flags, on the example's parser."""
    p.add_argument("--slow-rank", type=int, default=-1,
                   help="testing: this rank sleeps --slow-ms per step, plus (--slow-factor - 1) x its step time")
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--fault", choices=FAULTS, default=None,
                   help="testing hang diagnosis: --fault-rank misbehaves at --fault-step (sigstop, sigkill: "
                   "signals itself after its backward; sleep: sleeps between forward and backward; stall: "
                   "sleeps before the forward; skip, mismatch: skips, or sends a wrong-sized, the per-step "
                   "loss average that every rank runs when --fault is given)")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=3)
    p.add_argument("--slow-factor", type=float, default=1.0,
                   help="testing: the slow rank's steps take this many times as long (1.3 = a 1.3x rank)")
    p.add_argument("--slow-from", type=int, default=1, help="testing: the first step the slow rank is slow")
    p.add_argument("--slow-when", metavar="PATH",
                   help="testing: the slow rank is slow only from the first step at which PATH exists")
    p.add_argument("--hold-at", choices=HOLD_PHASES, default=None,
                   help="testing Ctrl-C: --hold-rank prints 'HOLD <phase>' and sleeps there (init: before joining "
                   "the process group; checkpoint: after the first checkpoint; resume: after loading the "
                   "checkpoint), so the other ranks wait for it in a collective")
    p.add_argument("--hold-rank", type=int, default=1)
    p.add_argument("--every-rank-done", action="store_true",
                   help="testing: every rank prints its 'rank=R done' line (otherwise rank 0 owns the console)")


class Slowdown:
    """--slow-rank: that rank sleeps --slow-ms per step plus (--slow-factor - 1) x its step time, from step
    --slow-from, and with --slow-when only from the first step at which that file exists."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.args, self.rank = args, rank
        self.now = not args.slow_when

    def __call__(self, step: int, began: float) -> None:
        """At the end of step ``step``, which began at ``began`` (time.perf_counter)."""
        args = self.args
        if self.rank != args.slow_rank or step < args.slow_from:
            return
        self.now = self.now or os.path.exists(args.slow_when)  # a stat a step, on the slow rank only
        if self.now:
            took = time.perf_counter() - began
            time.sleep(args.slow_ms / 1000 + (args.slow_factor - 1) * took)


def dump_flight_recorder(rank: int) -> None:
    """Testing hang diagnosis against torch's flight recorder: with TORCH_FR_BUFFER_SIZE and
    TORCH_FR_DUMP_TEMP_FILE set, a rank whose training failed writes its buffer where NCCL's dump-on-timeout
    would (gloo has no watchdog that dumps), for ``python -m torch.distributed.flight_recorder.fr_trace``."""
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    if not prefix or not os.environ.get("TORCH_FR_BUFFER_SIZE"):
        return
    dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace", None)
    if dump is not None:
        with open(f"{prefix}{rank}", "wb") as f:
            f.write(dump())
