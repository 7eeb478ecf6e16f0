"""The launcher's own look at the ranks it started on its node: a rank whose process is stopped is named
within seconds, whether or not any collective waits on it yet.

Rank 0's hang reader names a stopped rank once the others wait on it in a collective. Until then nothing
does: rank 0 may be evaluating, loading data, or waiting in no collective at all, and the stopped rank
publishes nothing because nothing changes. Its launcher (torchrun's agent runs in `npudist launch`'s
process, so the ranks are its children) sees the process state directly: O(local ranks) per node, no store
traffic. A stopped process (state T: SIGSTOP, SIGTSTP) or one held by a debugger (t) is named once after
STOPPED_NAMED_S and again when it runs again. It is only named: what aborts a stopped rank is the hang
reader, once a collective waits on it (a job suspended on purpose, as Slurm's ``scontrol suspend`` does,
stops every process of the job, this one included, and so says nothing).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

STOPPED_NAMED_S = 10.0
"""A rank seen stopped this long is named (a debugger's single step or a short pause says nothing)."""
POLL_S = 2.0
"""How often the launcher looks at its ranks' process states."""
_HOW = MappingProxyType({"stopped": "stopped (state T: SIGSTOP or SIGTSTP)",
                         "tracing-stop": "held by a debugger (state t)"})


@dataclass(frozen=True)
class Seen:
    """One of the launcher's child processes as the process table shows it."""

    pid: int
    rank: str
    """Its RANK (torchrun sets it in each worker's environment); "?" where it cannot be read."""
    status: str
    """psutil's status word: running, sleeping, disk-sleep, stopped, tracing-stop, zombie..."""


@dataclass
class StoppedRanks:
    """What has been said of which process (pure: fed what the process table showed, and when)."""

    host: str
    since: dict[int, float] = field(default_factory=dict)
    """pid -> when it was first seen stopped in the current stop."""
    named: set[int] = field(default_factory=set)

    def observe(self, seen: Sequence[Seen], now: float) -> list[str]:
        """The lines to say after this look: a rank stopped for STOPPED_NAMED_S, a named rank that runs again."""
        lines = []
        for s in seen:
            if s.status in _HOW:
                first = self.since.setdefault(s.pid, now)
                if s.pid not in self.named and now - first >= STOPPED_NAMED_S:
                    self.named.add(s.pid)
                    lines.append(
                        f"npudist launch: rank {s.rank} (pid {s.pid} on {self.host}) has been {_HOW[s.status]} for "
                        f"{now - first:.0f} s: the job will wait for it at its next collective, and the hang "
                        f"reader aborts the job once it does; resume it with `kill -CONT {s.pid}`, or end it with "
                        f"`kill -9 {s.pid}`")
            elif s.pid in self.since:
                del self.since[s.pid]
                if s.pid in self.named:
                    self.named.discard(s.pid)
                    lines.append(f"npudist launch: rank {s.rank} (pid {s.pid} on {self.host}) runs again")
        gone = set(self.since) - {s.pid for s in seen}
        for pid in gone:
            self.since.pop(pid, None)
            self.named.discard(pid)
        return lines


def children(pid: int) -> list[Seen]:
    """The direct children of ``pid`` with their RANK and status (those that vanish meanwhile are left out)."""
    import psutil

    out = []
    try:
        kids = psutil.Process(pid).children()
    except psutil.Error:
        return out
    for kid in kids:
        try:
            status = kid.status()
            try:
                rank = kid.environ().get("RANK", "?")
            except psutil.Error:
                rank = "?"
        except psutil.Error:
            continue
        out.append(Seen(pid=kid.pid, rank=rank, status=status))
    return out


@contextlib.contextmanager
def watching(poll_s: float = POLL_S) -> Iterator[StoppedRanks]:
    """Look at this process's children every ``poll_s`` while the block runs, saying on stderr what
    StoppedRanks says; the thread is a daemon and is joined on the way out."""
    said = StoppedRanks(host=socket.gethostname())
    stop = threading.Event()

    def loop() -> None:
        me = os.getpid()
        while not stop.wait(poll_s):
            try:
                for line in said.observe(children(me), time.monotonic()):
                    print(line, file=sys.stderr, flush=True)
            except Exception:  # a look that fails says nothing; the job goes on
                continue

    thread = threading.Thread(target=loop, name="npudist-local-ranks", daemon=True)
    thread.start()
    try:
        yield said
    finally:
        stop.set()
        thread.join(poll_s + 1.0)
