"""The faults, slow ranks and holds the tests inject into examples/train_ddp.py, kept out of the example.

The example stays what a user would copy; its command line keeps these flags (checks outside this repository
run it with --slow-rank and --slow-ms), added by ``add_arguments``, and its loop runs inside ``injected()``,
which places the knobs with hooks: the model's forward pre-hook (a step's start), its forward hook (between
forward and backward) and torch's global optimizer post-step hook (a step's end, after npudist's own, so
npudist has counted the step first). Each knob acts on one rank at one place of a step, and only when its
flag is given.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from collections.abc import Iterator

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

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


def step_average(args: argparse.Namespace, step: int, rank: int, device: torch.device) -> bool:
    """With --fault, every rank runs one extra average every step: the collective skip and mismatch break.

    False: this rank skips it and stops training, as a rank whose data ran out a step early (a rank that
    skipped one call and went on would have gloo abort a peer: "collective mismatch").
    """
    if args.fault is None:
        return True
    value = torch.ones(1, device=device)
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
                   help="testing: this rank sleeps --slow-ms per step, plus (--slow-factor - 1) x its step time "
                   "(from its forward to the end of its optimizer step)")
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--fault", choices=FAULTS, default=None,
                   help="testing hang diagnosis: --fault-rank misbehaves at --fault-step (sigstop, sigkill: "
                   "signals itself after its backward; sleep: sleeps between forward and backward; stall: "
                   "sleeps before the forward; skip, mismatch: skips, or sends a wrong-sized, the per-step "
                   "average that every rank runs when --fault is given)")
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


class Skipped(Exception):
    """--fault skip: this rank leaves its training loop (raised at the step's end; ``injected`` ends the loop)."""


class _Knobs:
    """The hooks ``injected`` installs; ``done`` is the last step this rank finished."""

    def __init__(self, args: argparse.Namespace, rank: int, start: int) -> None:
        self.args, self.rank, self.start, self.done = args, rank, start, start
        self.slow_now = not args.slow_when
        self.began = time.perf_counter()
        self.device = torch.device("cpu")

    def before_forward(self, _module: torch.nn.Module, inputs: tuple) -> None:
        args, done = self.args, self.done
        if args.run_dir and done > self.start and done % args.checkpoint_every == 0 and \
                done - args.checkpoint_every <= self.start:  # this process saved its first checkpoint at ``done``
            hold(args, self.rank, "checkpoint")
        self.began = time.perf_counter()
        if inputs and isinstance(inputs[0], torch.Tensor):
            self.device = inputs[0].device
        inject(args, done + 1, self.rank, "start")

    def after_forward(self, _module: torch.nn.Module, _inputs: tuple, _output: object) -> None:
        inject(self.args, self.done + 1, self.rank, "backward")

    def after_step(self, _optimizer: torch.optim.Optimizer, _args: object, _kwargs: object) -> None:
        step = self.done = self.done + 1
        inject(self.args, step, self.rank, "end")
        if not step_average(self.args, step, self.rank, self.device):
            raise Skipped
        self.slow_down(step)

    def slow_down(self, step: int) -> None:
        """--slow-rank: that rank sleeps --slow-ms plus (--slow-factor - 1) x the time since its forward began,
        from step --slow-from, and with --slow-when only from the first step at which that file exists."""
        args = self.args
        if self.rank != args.slow_rank or step < args.slow_from:
            return
        self.slow_now = self.slow_now or os.path.exists(args.slow_when)  # a stat a step, on the slow rank only
        if self.slow_now:
            took = time.perf_counter() - self.began
            time.sleep(args.slow_ms / 1000 + (args.slow_factor - 1) * took)


@contextlib.contextmanager
def injected(args: argparse.Namespace, rank: int, model: torch.nn.Module, start: int) -> Iterator[None]:
    """Around the example's loop (entered after npudist.loop(), so its step hook runs before ours): holds,
    faults and slow ranks at their places in each step, a --fault skip ending the loop, and the flight
    recorder's dump when a step fails. ``start`` is the step the run resumed from (0: a fresh run)."""
    if start:
        hold(args, rank, "resume")
    knobs = _Knobs(args, rank, start)
    handles = [model.register_forward_pre_hook(knobs.before_forward), model.register_forward_hook(knobs.after_forward),
               register_optimizer_step_post_hook(knobs.after_step)]
    try:
        yield
    except Skipped:
        pass
    except Exception:
        dump_flight_recorder(rank)
        raise
    finally:
        for handle in handles:
            handle.remove()


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
