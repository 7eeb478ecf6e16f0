"""One rank of `npudist test`, started by `npudist launch -m npudist.selftest.rank`.

Every check computes its expected answer on this rank alone (the inputs are a function of the rank), so a
wrong result is caught without trusting another collective. Results go to this rank's file (records.py).
A check that raises ends this rank's run: the others would wait for it in the next collective, and torchrun
stops them when this rank exits non-zero.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import IO

import torch

import npudist
from npudist import checkpoint, comm
from npudist.runtime.env import rank_info
from npudist.selftest.records import CHECKS, FAIL, PASS, SKIP

CHECKPOINT_FOLDER = "npudist-test-checkpoint"
"""The checkpoint check's folder inside --checkpoint-dir (or the records folder)."""
ELEMENTS = 4096
"""Elements per rank in each collective: several gloo/HCCL chunks, still well under a millisecond."""


class CheckFailed(AssertionError):
    """A check's result was wrong; the message says how."""


def pattern(rank: int, n: int, *, offset: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input: rank + 1 + (index % 4), so every rank and position differs predictably."""
    return (rank + 1 + (torch.arange(offset, offset + n) % 4)).to(torch.float32)


def _compare(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got = got.detach().to("cpu", torch.float32).reshape(want.shape)
    bad = (got - want).abs() > 1e-4 * want.abs().clamp(min=1)
    if bad.any():
        at = tuple(int(i) for i in bad.nonzero()[0])
        raise CheckFailed(f"{what}: {int(bad.sum())} of {want.numel()} elements differ (first at {list(at)}: "
                          f"got {got[at].item():g}, want {want[at].item():g})")


def check_all_reduce(ctx: npudist.DistContext, _: Path) -> str:
    got = comm.all_reduce(pattern(ctx.rank, ELEMENTS).to(ctx.device), "sum")
    _compare(got, sum(pattern(r, ELEMENTS) for r in range(ctx.world_size)), "sum")
    return f"sum of {ELEMENTS} float32 over {ctx.world_size} ranks is exact"


def check_broadcast(ctx: npudist.DistContext, _: Path) -> str:
    src = ctx.world_size - 1  # not rank 0: rank 0 would already hold the answer from rank 0
    got = comm.broadcast(pattern(ctx.rank, ELEMENTS).to(ctx.device), src)
    _compare(got, pattern(src, ELEMENTS), f"broadcast from rank {src}")
    return f"{ELEMENTS} float32 from rank {src} arrived whole"


def check_all_gather(ctx: npudist.DistContext, _: Path) -> str:
    got = comm.all_gather(pattern(ctx.rank, ELEMENTS).to(ctx.device))
    _compare(got, torch.stack([pattern(r, ELEMENTS) for r in range(ctx.world_size)]), "gathered rows")
    return f"{ctx.world_size} x {ELEMENTS} float32 in rank order"


def check_reduce_scatter(ctx: npudist.DistContext, _: Path) -> str:
    world, n = ctx.world_size, ELEMENTS
    got = comm.reduce_scatter(pattern(ctx.rank, world * n).to(ctx.device), "sum")
    want = sum(pattern(r, n, offset=ctx.rank * n) for r in range(world))
    _compare(got, want, f"rank {ctx.rank}'s reduced slice")
    return f"each rank's {n}-element slice of the sum is exact"


def check_all_reduce_many(ctx: npudist.DistContext, _: Path) -> str:
    shapes = ((7,), (3, 5), (ELEMENTS,))  # odd sizes across buckets, as a model's gradients are
    tensors = [pattern(ctx.rank * (k + 1), s.numel()).reshape(s).to(ctx.device)
               for k, s in enumerate(map(torch.Size, shapes))]
    got = comm.all_reduce_many(tensors, "avg")
    for k, (t, s) in enumerate(zip(got, map(torch.Size, shapes), strict=True)):
        want = sum(pattern(r * (k + 1), s.numel()) for r in range(ctx.world_size)) / ctx.world_size
        _compare(t, want.reshape(s), f"tensor {k} of the bucketed average")
    return f"{len(shapes)} tensors averaged in buckets"


def _batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(1000 * (step + 1) + rank))


DDP_STEPS = 2
"""The second step runs on the buckets DDP rebuilds after the first (and is when DDP starts its sampled
runtime stats), so both paths a training's steps take are checked."""


def check_ddp_step(ctx: npudist.DistContext, _: Path, state: dict) -> str:
    """Steps of npudist.ddp on different data per rank: each gradient must be the mean of every rank's gradient
    (computed here on this rank's CPU from the other ranks' known batches), and so each update."""
    torch.manual_seed(0)
    reference = torch.nn.Linear(8, 4)
    model = npudist.ddp(copy.deepcopy(reference))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(DDP_STEPS):
        opt.zero_grad()
        model(_batch(ctx.rank, step).to(ctx.device)).pow(2).mean().backward()
        grads = []
        for r in range(ctx.world_size):
            reference.zero_grad()
            reference(_batch(r, step)).pow(2).mean().backward()
            grads.append([p.grad.clone() for p in reference.parameters()])
        want = [sum(g[i] for g in grads) / ctx.world_size for i in range(len(grads[0]))]
        for (name, p), g in zip(model.module.named_parameters(), want, strict=True):
            _compare(p.grad, g, f"step {step + 1}: gradient of {name}")
        opt.step()
        with torch.no_grad():
            for p0, g in zip(reference.parameters(), want, strict=True):
                p0 -= 0.1 * g
        for (name, p), p0 in zip(model.module.named_parameters(), reference.parameters(), strict=True):
            _compare(p, p0.detach(), f"step {step + 1}: {name} after the update")
    state["model"] = model.module
    return f"{DDP_STEPS} steps: each gradient is every rank's mean and each update matches"


def check_checkpoint(ctx: npudist.DistContext, out: Path, state: dict) -> str:
    """A synchronous save by rank 0 and a load on every rank: the same tensors and step come back."""
    directory = out / CHECKPOINT_FOLDER
    module = state["model"] if state.get("model") is not None else torch.nn.Linear(8, 4)
    saved = {"model": {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}, "step": 1}
    checkpoint.save(saved, directory, 1, overwrite=True)  # a folder an earlier test left: step 1 again
    if not directory.is_dir():
        raise _Skip(f"{directory} is not on this node: rank 0 wrote it on its own; pass --checkpoint-dir on a "
                    "filesystem every node shares to check loading on all of them")
    with _kept_warnings("npudist.checkpoint") as why:
        found = checkpoint.load_latest(directory)
    if found is None:
        raise CheckFailed(f"checkpoint 1 was saved to {directory} but load_latest found no good checkpoint there"
                          + (f" ({'; '.join(why)})" if why else ""))
    loaded, step = found
    if step != 1 or loaded.get("step") != 1:
        raise CheckFailed(f"loaded step {step} (state step {loaded.get('step')!r}), saved step 1")
    for name, tensor in saved["model"].items():
        if name not in loaded.get("model", {}):
            raise CheckFailed(f"{name} is missing from the loaded checkpoint")
        _compare(loaded["model"][name], tensor, f"loaded {name}")
    return "step 1 saved by rank 0 and loaded back bit-exact on every rank"


@contextlib.contextmanager
def _kept_warnings(logger: str) -> Iterator[list[str]]:
    """The warnings ``logger`` gives meanwhile (why a checkpoint was skipped), for the verdict's detail."""
    got: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: got.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger(logger).addHandler(handler)
    try:
        yield got
    finally:
        logging.getLogger(logger).removeHandler(handler)


class _Skip(Exception):
    """The check cannot run here; the message says why and what to do."""


def _plain(fn: Callable[[npudist.DistContext, Path], str]) -> Callable[[npudist.DistContext, Path, dict], str]:
    return lambda ctx, out, _state: fn(ctx, out)


RUNNERS: MappingProxyType[str, Callable[[npudist.DistContext, Path, dict], str]] = MappingProxyType({
    "all_reduce": _plain(check_all_reduce),
    "broadcast": _plain(check_broadcast),
    "all_gather": _plain(check_all_gather),
    "reduce_scatter": _plain(check_reduce_scatter),
    "all_reduce_many": _plain(check_all_reduce_many),
    "ddp_step": check_ddp_step,
    "checkpoint": check_checkpoint,
})
"""Each check after process_group, by name (records.CHECKS gives the order)."""


class _Log:
    """This rank's record file: one flushed JSON line per event, so the parent sees a hang as it happens."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def start(self, check: str) -> None:
        self._write({"check": check, "event": "start"})

    def end(self, check: str, status: str, detail: str, seconds: float) -> None:
        self._write({"check": check, "event": "end", "status": status, "detail": detail,
                     "seconds": round(seconds, 4)})

    def _write(self, row: dict) -> None:
        self.stream.write(json.dumps(row) + "\n")
        self.stream.flush()


def _run(log: _Log, check: str, fn: Callable[[], str]) -> bool:
    log.start(check)
    began = time.perf_counter()
    try:
        detail = fn()
    except CheckFailed as exc:
        log.end(check, FAIL, str(exc), time.perf_counter() - began)
        return True  # a wrong answer leaves the group usable: the next checks still run
    except _Skip as exc:
        log.end(check, SKIP, str(exc), time.perf_counter() - began)
        return True
    except Exception as exc:  # any error: recorded with where it came from, then this rank stops
        where = traceback.extract_tb(exc.__traceback__)[-1]
        log.end(check, FAIL, f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})",
                time.perf_counter() - began)
        return False
    log.end(check, PASS, detail, time.perf_counter() - began)
    return True


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npudist.selftest.rank")
    p.add_argument("--out", required=True, help="folder for the rank files (rank<N>.jsonl)")
    p.add_argument("--checkpoint-dir", default=None, help="where the checkpoint check saves (default OUT)")
    p.add_argument("--timeout", type=float, default=60.0, help="process group timeout in seconds")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out)
    rank = rank_info(os.environ).rank
    with (out / f"rank{rank}.jsonl").open("a") as stream:
        log = _Log(stream)
        joined: list[npudist.DistContext] = []

        def join() -> str:
            joined.append(npudist.init(timeout=args.timeout))
            ctx = joined[0]
            return (f"{ctx.world_size} ranks over {ctx.backend} on {ctx.accelerator.name} "
                    f"(this rank: {ctx.device}, host {socket.gethostname()})")

        if not _run(log, CHECKS[0], join) or not joined:
            return 1
        ctx, state = joined[0], {}
        where = Path(args.checkpoint_dir) if args.checkpoint_dir else out
        try:
            for check in CHECKS[1:]:
                if not _run(log, check, lambda c=check: RUNNERS[c](ctx, where, state)):
                    return 1
        finally:
            npudist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
