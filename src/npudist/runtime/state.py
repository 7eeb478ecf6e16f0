"""The Runtime: the one owner of this process's npudist state, and the holder of the current one.

Everything npudist keeps between calls (settings, accelerator detection, the collectives' group cache,
recorder, hang watchdog and buffers, the checkpoint writer, the DistContext of init()) and everything a
rank starts (its metrics server and device poller, run log, run-directory lock, process group) hangs off
one Runtime; ``close()`` ends all of it in the order written in CLOSE_ORDER, and ``npudist.shutdown()``
is that close. Collectives also work after a plain ``torch.distributed.init_process_group`` without
``npudist.init()``, so the Runtime starts on first use.

``_current`` below is the only module-level mutable state npudist has (tests/test_no_global_state.py
checks that): the Runtime in use, or None before first use and after close. Each part is created by the
package that uses it (``npudist.comm`` attaches its state on its first call, the telemetry server
registers itself with ``own()``), so this package is the ground layer: it imports nothing of npudist
outside ``runtime/``, not even for type hints (tests/test_layers.py), and layers point one way.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from npudist.runtime.settings import Settings

log = logging.getLogger("npudist.runtime")

CLOSE_ORDER = (
    "run_logs",       # their last record reads the collective counters and the device poller
    "telemetry",      # rank metrics servers and device pollers, before the counters they serve are dropped
    "checkpoints",    # the last background write lands; a sharded one still talks over comm's side group
    "comm",           # the watchdog's publisher joined; cached groups, the side group and buffers dropped
    "group",          # the bounded shutdown barrier, then the process group destroyed (not at exit)
    "backend",        # no collective in flight, the backend's native threads asleep (comm/quiesce.py; at exit too)
    "run_dir_locks",  # last: no rank writes the run directory once another job may take it
)
"""The order ``Runtime.close()`` ends a rank's parts in, first to last."""
_ATTACHED = frozenset({"checkpoints", "comm"})
"""Parts kept as attributes (created on first use by their package); the others are owned closers."""


class Runtime:
    """This process's npudist state; create it with ``current()`` (or ``npudist.init()``), end it with close()."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        """Guards the creation of parts that several threads may ask for at once."""
        self.context: Any = None
        """Set by npudist.init(): the DistContext (rank, device, backend) this process joined with."""
        self.unavailable: dict[str, str | None] = {}
        """Vendor name -> why it cannot be used here (None: usable), each probed once."""
        self.accelerator: Any = None
        """The detected (or NPUDIST_ACCELERATOR-forced) Accelerator, once asked for."""
        self.comm: Any = None
        """npudist.comm's CommState (group cache, recorder, watchdog, buffers), once a collective ran."""
        self.checkpoints: Any = None
        """The asynchronous CheckpointWriter, once a checkpoint was saved."""
        self.loop: Any = None
        """The watched training loop (telemetry/job/loop.py) npudist.init() makes; its parts are owned."""
        self._owned: dict[str, list[Callable[[], object]]] = {}

    def own(self, kind: str, close: Callable[[], object]) -> None:
        """Have ``close`` called when the Runtime closes, in ``kind``'s place in CLOSE_ORDER (the latest
        first within a kind). ``close`` must be safe to call again: its owner may close it earlier."""
        if kind not in CLOSE_ORDER or kind in _ATTACHED:
            raise ValueError(f"unknown part kind {kind!r}; one of {', '.join(sorted(set(CLOSE_ORDER) - _ATTACHED))}")
        with self.lock:
            self._owned.setdefault(kind, []).append(close)

    def owns(self, kind: str) -> bool:
        return bool(self._owned.get(kind))

    def close(self, *, at_exit: bool = False) -> None:
        """End every part in CLOSE_ORDER; safe to call twice.

        Invariant: nothing of npudist's holds a process group, runs a thread or serves a port once this
        returns, and the group is destroyed here rather than during interpreter finalization. A gloo
        group or a thread that lives into finalization can abort the process ("terminate called without
        an active exception"): its worker thread needs the GIL back inside a C++ destructor. Where a
        script keeps its group alive (a DDP module holds it even after destroy_process_group), the
        ``backend`` step waits until its threads are at rest instead (comm/quiesce.py says why). A part that
        fails to close does not keep the later ones running: the first failure (or a background
        checkpoint failure not raised yet, CheckpointError) is raised once all parts are closed, never
        in place of an exception already on its way out, and the others are logged.

        ``at_exit``: the exit hook of a process that never called shutdown(); the parts are released
        but the process group, if the user created it, stays theirs to end, and errors are only logged.
        """
        global _current
        errors: list[BaseException] = []
        for kind in CLOSE_ORDER:
            if at_exit and kind == "group":
                continue
            for close in self._take(kind):
                try:
                    result = close()
                except Exception as exc:  # one part's failure must not leave the later parts running
                    result = exc
                if isinstance(result, BaseException):
                    errors.append(result)
        self.context = None
        if _current is self:
            _current = None
        for extra in errors[1:]:
            log.error("while closing the npudist runtime: %s", extra)
        if errors:
            if at_exit or sys.exc_info()[0] is not None:
                log.error("%s", errors[0])
            else:
                raise errors[0]

    def _take(self, kind: str) -> list[Callable[[], object]]:
        if kind in _ATTACHED:
            part = getattr(self, kind)
            setattr(self, kind, None)
            return [part.close] if part is not None else []
        with self.lock:
            return list(reversed(self._owned.pop(kind, [])))


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
