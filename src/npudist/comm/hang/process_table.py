"""Which ranks' processes the reader can look at itself, and what its process table says of them.

A pid means something only in the process table it came from: the same kernel (its boot id,
``/proc/sys/kernel/random/boot_id``) and the same pid namespace (the inode of ``/proc/self/ns/pid``). A
host name says neither: boards flashed from one image and host-network containers share a name, and
containers and network-namespace nodes share a kernel but not a process table. So each rank publishes
this identity with its pid, and the reader looks a pid up only when the identity is its own; every
other rank is "not looked at" (rank_states.SILENT when it does not answer), never "gone".
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from npudist.diagnosis.place import Place
from npudist.diagnosis.rank_states import PROCESS_ALIVE, PROCESS_GONE, PROCESS_STOPPED


def identity(proc: str = "/proc") -> str | None:
    """``BOOT_ID:PIDNS_INODE`` of this process's process table; None where either cannot be read (then no
    pid is ever looked up)."""
    try:
        with open(os.path.join(proc, "sys/kernel/random/boot_id"), encoding="ascii") as f:
            boot = f.read().strip()
        pidns = os.stat(os.path.join(proc, "self/ns/pid")).st_ino
    except (OSError, ValueError):
        return None
    return f"{boot}:{pidns}" if boot else None


# psutil's status words (psutil.STATUS_*), as /proc/PID/stat's state letters read.
_STOPPED = frozenset({"stopped", "tracing-stop"})
_GONE = frozenset({"zombie", "dead"})


def classify_status(status: str | None) -> str:
    """A process's status as evidence: gone (no such process, a zombie), stopped (T, t) or alive."""
    if status is None or status in _GONE:
        return PROCESS_GONE
    return PROCESS_STOPPED if status in _STOPPED else PROCESS_ALIVE


def status_of(pid: int) -> str | None:
    """gone, stopped or alive for a pid of this process table; None when it cannot be read."""
    import psutil

    try:
        return classify_status(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return PROCESS_GONE
    except psutil.Error:
        return None


def local_processes(places: Mapping[int, Place], here: str | None) -> dict[int, str]:
    """What this process table says of the ranks whose published identity is ``here`` (gone, stopped or
    alive); nothing for the rest, nor for any rank when ``here`` is unknown."""
    out: dict[int, str] = {}
    if here is None:
        return out
    for r, place in places.items():
        if place.process_table == here and place.pid:
            status = status_of(place.pid)
            if status is not None:
                out[r] = status
    return out
