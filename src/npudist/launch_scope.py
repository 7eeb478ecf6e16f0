"""What stands around torchrun's agent while `npudist launch` runs it, and is undone however the job ends:
stop signals that raise from the first moment, torchrun's per-rank stop chatter filtered, the targets file
listing the ranks, and this node's peer snapshot holder."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from types import MappingProxyType
from typing import Protocol


class LaunchPlan(Protocol):
    """What these contexts read of launch.py's LaunchPlan (named here, not imported: launch imports this)."""

    targets_file: str | None
    targets: list[dict[str, object]]
    peer_snapshots: int | None
    peer_bind: str

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


@contextlib.contextmanager
def peer_holder(the_plan: LaunchPlan) -> Iterator[None]:
    """This node's peer snapshot holder while the agent runs (--peer-snapshots); the ranks find it through
    NPUDIST_PEER_HOLDER. It lives in this process because torchrun restarts workers as new processes."""
    if the_plan.peer_snapshots is None:
        yield
        return
    from npudist.checkpoint import peer
    from npudist.checkpoint import peer_holder as holder

    with holder.serving(the_plan.peer_bind) as server:
        os.environ[peer.HOLDER_VAR] = server.address
        os.environ[peer.EVERY_VAR] = str(the_plan.peer_snapshots)
        print(f"npudist launch: peer snapshots every {the_plan.peer_snapshots} steps; this node's holder "
              f"serves {server.address}", file=sys.stderr, flush=True)
        yield


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
