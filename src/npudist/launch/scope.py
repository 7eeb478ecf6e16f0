"""What stands around torchrun's agent while `npudist launch` runs it, and is undone however the job ends:
stop signals that raise from the first moment, torchrun's per-rank stop chatter filtered, the targets file
listing the ranks, and this node's peer snapshot holder."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import MappingProxyType
from typing import Protocol


class LaunchPlan(Protocol):
    """What these contexts read of planner.py's LaunchPlan (named here, not imported: runner.py imports this)."""

    targets_file: str | None
    targets: list[dict[str, object]]
    peer_snapshots: int | None
    peer_bind: str
    multi_node: bool

_STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
_STOP_CHATTER = MappingProxyType({
    "torch.distributed.elastic.agent.server.api": "Received %s death signal, shutting down workers",
    "torch.distributed.elastic.multiprocessing.api": "Sending process %s closing signal %s",
})
"""torchrun's warnings while it stops the ranks on a signal the user sent: the ranks say where they stopped
(one line), so these lines (one per rank) only repeat that a stop was asked for."""


def _not_stop_chatter(record: logging.LogRecord) -> bool:
    return record.msg != _STOP_CHATTER.get(record.name)


@contextlib.contextmanager
def quiet_stop() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _STOP_CHATTER]
    for lg in loggers:
        lg.addFilter(_not_stop_chatter)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(_not_stop_chatter)


@contextlib.contextmanager
def published(the_plan: LaunchPlan) -> Iterator[None]:
    """The targets file lists the ranks while they run and is emptied (``[]``) however the job ends.

    An empty list, not a deleted file: Prometheus file_sd drops the ranks' targets at its next read, so a
    job that ended pages no one, and the scrape config stays valid for the next job (the sbatch script
    does the same with a trap, deploy/slurm.py).
    """
    if not the_plan.targets_file:
        yield
        return
    from npudist.telemetry.exposition.targets import write_targets

    write_targets(the_plan.targets_file, the_plan.targets)
    try:
        yield
    finally:
        write_targets(the_plan.targets_file, [])


QUIET_S = 600.0
"""Seconds after the holder starts with no copy from any rank before launch says that none was taken: a
script that never calls the snapshot API runs unprotected, and only this line says so. (The holder sees
no steps, so time stands in for the issue's 2K steps; the line is said again at the end of a job that
never sent one, if it ended sooner.)"""


@contextlib.contextmanager
def peer_holder(the_plan: LaunchPlan) -> Iterator[None]:
    """This node's peer snapshot holder while the agent runs (--peer-snapshots); the ranks find it through
    NPUDIST_PEER_HOLDER and sign their requests with NPUDIST_PEER_SECRET (peer_auth.py). It lives in this
    process because torchrun restarts workers as new processes."""
    if the_plan.peer_snapshots is None:
        yield
        return
    from npudist.checkpoint import peer, peer_auth
    from npudist.checkpoint import peer_holder as holder

    secret, source = peer_auth.launch_secret(os.environ, multi_node=the_plan.multi_node)
    told = threading.Event()

    def say_none_taken(seconds: float) -> None:
        if not told.is_set():
            told.set()
            print(f"npudist launch: no rank has sent a peer snapshot in the {seconds:.0f} s this job has run: "
                  "nothing is protected by in-memory copies (a script must call npudist.checkpoint."
                  "peer_snapshots() and, every step, peer.due(step) and peer.snapshot(state, step); see "
                  "docs/guide/fault-tolerance.md)", file=sys.stderr, flush=True)

    with holder.serving(the_plan.peer_bind, secret=bytes.fromhex(secret),
                        max_bytes=holder.max_copy_bytes()) as server:
        os.environ[peer.HOLDER_VAR] = server.address
        os.environ[peer.EVERY_VAR] = str(the_plan.peer_snapshots)
        os.environ[peer_auth.SECRET_VAR] = secret
        print(f"npudist launch: peer snapshots every {the_plan.peer_snapshots} steps; this node's holder "
              f"serves {server.address} to requests signed with the job's secret ({source})",
              file=sys.stderr, flush=True)
        timer = threading.Timer(QUIET_S, lambda: server.holder.accepted or say_none_taken(QUIET_S))
        timer.daemon = True
        timer.name = "npudist-peer-quiet"
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            timer.join()
            if not server.holder.accepted:
                say_none_taken(time.monotonic() - server.started)


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """SIGTERM/SIGINT/SIGHUP raise torchrun's SignalException from the first moment, not only once its agent
    has started the workers (it installs the same handler then): the default action would end this
    process without running the clean-up above."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    def _raise(signum: int, _frame: object) -> None:
        sig = signal.Signals(signum)
        raise SignalException(f"npudist launch got {sig.name}", sigval=sig)

    saved = {}
    for name in _STOP_SIGNALS:
        sig = getattr(signal, name)
        saved[sig] = signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
