"""Servers that `npudist observe` starts and that must not outlive it, however it ends.

A process group or session does not do that: when observe is SIGKILLed nothing runs its clean-up, and the
servers in their own session keep running (Prometheus holding its port). Only a parent-death signal set in
the child survives that: ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` (prctl(2); Linux only), set between fork and
exec, asks the kernel to send SIGTERM to the child when the thread that started it exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for Popen: the child gets ``sig`` when this process dies (None off Linux, where there
    is no such call and the clean-up in observe's ``finally`` is all there is)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(126)  # no guarantee to give: refuse to start rather than risk an orphan
        if os.getppid() != parent:  # the parent died before the call above: the signal will never come
            os._exit(126)

    return preexec
