"""The Runtime: the one owner of this process's npudist state, and the holder of the current one.

Everything npudist keeps between calls (settings, accelerator detection, the collectives' group cache,
recorder, hang watchdog and buffers, the checkpoint writer, the DistContext of init()) hangs off one
Runtime; ``close()`` ends all of it, and ``npudist.shutdown()`` is that close. Collectives also work
after a plain ``torch.distributed.init_process_group`` without ``npudist.init()``, so the Runtime starts
on first use.

``_current`` below is the only module-level mutable state npudist has (tests/test_no_global_state.py
checks that): the Runtime in use, or None before first use and after close. Each part is created by the
package that uses it (``npudist.comm`` attaches its state on its first call), so this module imports
nothing of npudist beyond the settings, and layers point one way: comm and accelerators read the Runtime;
the Runtime never imports them.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from datetime import timedelta
from typing import TYPE_CHECKING

from npudist.runtime.settings import Settings

if TYPE_CHECKING:
    from npudist.accelerators import Accelerator
    from npudist.checkpoint.writer import CheckpointWriter
    from npudist.comm.state import CommState
    from npudist.runtime.lifecycle import DistContext

log = logging.getLogger("npudist.runtime")
SHUTDOWN_BARRIER_S = 30.0


class Runtime:
    """This process's npudist state; create it with ``current()`` (or ``npudist.init()``), end it with close()."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        """Guards the creation of parts that several threads may ask for at once."""
        self.context: DistContext | None = None
        """Set by npudist.init(): the rank, device and backend this process joined with."""
        self.unavailable: dict[str, str | None] = {}
        """Vendor name -> why it cannot be used here (None: usable), each probed once."""
        self.accelerator: Accelerator | None = None
        """The detected (or NPUDIST_ACCELERATOR-forced) accelerator, once asked for."""
        self.comm: CommState | None = None
        """npudist.comm's group cache, recorder, watchdog and buffers, once a collective ran."""
        self.checkpoints: CheckpointWriter | None = None
        """The asynchronous checkpoint writer, once a checkpoint was saved."""

    def close(self, *, at_exit: bool = False) -> None:
        """Release every part, then destroy the process group; safe to call twice.

        Invariant: nothing of npudist's holds a process group or runs a thread once this returns, and
        the group is destroyed here rather than during interpreter finalization. A gloo group or a
        thread that lives into finalization can abort the process ("terminate called without an active
        exception"): its worker thread needs the GIL back inside a C++ destructor. So the last
        asynchronous checkpoint write lands first (a sharded one talks over the group), the watchdog's
        publisher is joined and the cached groups are dropped; then, unless an exception is on its way
        out (a peer may be gone), the ranks meet at a bounded barrier so that no rank destroys its group
        while a peer's last collective is still in flight. A background checkpoint failure not raised
        yet is raised last (CheckpointError), never in place of an exception already on its way out.

        ``at_exit``: the exit hook of a process that never called shutdown(); the parts are released
        but the process group, if the user created it, stays theirs to end, and errors are only logged.
        """
        global _current
        checkpoint_error = self.checkpoints.close() if self.checkpoints is not None else None
        if self.comm is not None:
            self.comm.close()
        self.context = None
        if _current is self:
            _current = None
        if not at_exit:
            end_group()
        if checkpoint_error is not None:
            if at_exit or sys.exc_info()[0] is not None:
                log.error("%s", checkpoint_error)
            else:
                raise checkpoint_error


def end_group() -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if sys.exc_info()[0] is None and dist.get_world_size() > 1:
        try:
            if str(dist.get_backend()) == "gloo":
                dist.monitored_barrier(timeout=timedelta(seconds=SHUTDOWN_BARRIER_S))
            else:
                dist.barrier()
        except Exception as exc:  # a peer that already left must not turn shutdown into an error
            log.debug("shutdown barrier failed: %s", exc)
    dist.destroy_process_group()


_current: Runtime | None = None
_start_lock = threading.Lock()


def current() -> Runtime:
    """The Runtime in use, started (settings read from the environment) on first use."""
    rt = _current
    return rt if rt is not None else _start()


def peek() -> Runtime | None:
    """The Runtime in use, or None: never starts one."""
    return _current


def _start() -> Runtime:
    global _current
    with _start_lock:
        if _current is None:
            _current = Runtime(Settings.from_env())
            # The one exit hook: a process that never called shutdown() still gets its parts released.
            atexit.unregister(_close_at_exit)
            atexit.register(_close_at_exit)
        return _current


def _close_at_exit() -> None:
    rt = _current
    if rt is not None:
        rt.close(at_exit=True)
