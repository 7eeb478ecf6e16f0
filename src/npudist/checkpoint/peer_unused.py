"""A job that asked for peer snapshots and takes none: said once, and visible to the alert.

``npudist launch --peer-snapshots K`` starts the holders and tells the ranks K; a script that never calls
the snapshot API runs unprotected while the launch line says the holder serves (issue 46). The launcher
sees no steps, so it can only say it after a time (launch.scope.QUIET_S) or at the end; a rank that runs
npudist (``npudist.init()``) sees them: it counts the steps of its first optimizer (torch's global step
hook, one Python call a step) and, once 2K steps have run with no copy sent, rank 0 says once that no
snapshot was taken, and the rank's checkpoint stats carry the copy's age so that NpudistNoFreshPeerSnapshot
(age above 2K) fires as it does for a script whose snapshots stopped.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable
from typing import Any, TextIO

from torch.optim.optimizer import register_optimizer_step_post_hook

from npudist.checkpoint.peer import EVERY_VAR, HOLDER_VAR, PeerStats


class UnusedWatch:
    """Counts optimizer steps until a copy is sent; says once, after 2K steps without one, that none was."""

    def __init__(self, every: int, rank: int, *, sent: Callable[[], bool],
                 out: TextIO | None = None) -> None:
        self.every, self.rank, self.steps, self.told = every, rank, 0, False
        self._sent, self._out = sent, out
        self._first: weakref.ref[Any] | None = None
        self._done = False
        """The script takes snapshots: nothing more to count (the hook stays until close(): torch iterates its
        global hooks while it calls them, so one must not remove itself from inside)."""
        self._hook: Any = register_optimizer_step_post_hook(self._after_step)

    def _after_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        # One optimizer's steps are the loop's steps: a script that steps two per iteration counts once.
        if self._done:
            return
        if self._first is None or self._first() is None:
            self._first = weakref.ref(optimizer)
        if self._first() is not optimizer:
            return
        self.steps += 1
        if self.steps < 2 * self.every:
            return
        if self._sent():  # the script takes snapshots: its own stats and the alert cover it from here
            self._done = True
            return
        if not self.told:
            self.told = True
            if self.rank == 0:
                print(f"npudist: {self.steps} optimizer steps have run under `npudist launch --peer-snapshots "
                      f"{self.every}` and no rank sent a peer snapshot: nothing is protected by in-memory "
                      "copies. Call npudist.checkpoint.peer_snapshots() once and, every step, "
                      "peer.due(step) and peer.snapshot(state, step) (docs/guide/fault-tolerance.md), or drop "
                      "--peer-snapshots", file=self._out or sys.stderr, flush=True)

    def stats(self) -> PeerStats:
        """What the exporter shows while no copy was sent: every step since the start is the copy's age."""
        return PeerStats(age_steps=self.steps, every=self.every)

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


def start(rank: int, env: dict[str, str] | None = None) -> UnusedWatch | None:
    """The watch of this rank when launch turned peer snapshots on (NPUDIST_PEER_HOLDER and
    NPUDIST_PEER_SNAPSHOT_EVERY set), kept by the Runtime's checkpoint writer; else None."""
    env = os.environ if env is None else env
    every = env.get(EVERY_VAR, "")
    if not env.get(HOLDER_VAR) or not every.isdigit() or int(every) <= 0:
        return None
    from npudist.checkpoint.writer import writer

    w = writer()
    if w.unused is None:
        w.unused = UnusedWatch(int(every), rank, sent=lambda: w.peer is not None and w.peer.stats.snapshots > 0)
    return w.unused
