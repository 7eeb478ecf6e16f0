"""What a rank that the others wait for is doing, and what npudist may do about it (pure; one table).

A hang verdict names the ranks that hold the job back (hang.py). Before anything is aborted, each of them
is put in one of the states below from what the probe saw: no answer at all, or two looks at the rank's
main thread ``SAMPLE_GAP_S`` apart (its CPU time and its Python stack), taken by the rank's own watchdog
thread. Only what is certainly dead or certainly stuck is aborted soon; a rank that is running (an
evaluation on rank 0, a synchronous checkpoint, a compile at start) is reported and left alone, as torch's
own default leaves it until the collective timeout.

STATES is the README's table of rank states; the reader (hang_reader.py) applies its bounds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from types import MappingProxyType

SAMPLE_GAP_S = 0.5
"""Wall seconds between the two looks a probed rank takes at its main thread."""
BUSY_CPU_RATIO = 0.1
"""Main-thread time on or waiting for a CPU over wall time, between the two looks, from which a rank is
running: a Python loop is on a CPU or in the run queue all the time however loaded the host (Linux
schedstat's run delay counts the wait), a thread asleep or blocked in a system call gets ~0."""

GONE, STOPPED, OUT_OF_ORDER, STUCK, BUSY, DECLARED = "gone", "stopped", "out_of_order", "stuck", "busy", "declared"
STARVED, SILENT = "starved", "silent"
UNPROBED = "unprobed"
SILENT_ABORT_S = 60.0
"""Stall after which a rank that does not answer, and whose process cannot be looked at from the reader's
process table (another host, another container), is aborted: silence alone is not proof of death (a call
that holds the GIL starves the watchdog thread too), so it gets longer than the stall bound, and a
stopped rank elsewhere still ends in a minute instead of the collective timeout."""

# What a process table says of a rank's process (process_table.py): only these count as evidence.
PROCESS_GONE, PROCESS_STOPPED, PROCESS_ALIVE = "gone", "stopped", "alive"


@dataclass(frozen=True)
class State:
    name: str
    seen: str
    """How npudist tells this state."""
    action: str
    """What the hang reader does (with NPUDIST_HANG_ACTION=abort, the default)."""
    bound: str
    """After how long, counted from the job's last progress."""
    abort: str
    """now, silent (SILENT_ABORT_S), stuck (NPUDIST_STUCK_TIMEOUT) or busy (NPUDIST_BUSY_TIMEOUT, unset by
    default: never)."""


STATES = MappingProxyType({s.name: s for s in (
    State(GONE, "its watchdog shut down (npudist.shutdown() ran), or its process no longer exists",
          "named; the job is aborted", "the verdict: the stall bound (>= 10 s) plus the probe (~3 s)", "now"),
    State(STOPPED, "its watchdog thread does not answer the probe and its process is stopped (state T: "
          "SIGSTOP, a debugger), seen in the process table it shares with the reader", "named, no stack; the job "
          "is aborted", "the verdict (~15 s)", "now"),
    State(SILENT, "its watchdog thread does not answer the probe and its process is in no process table the "
          "reader can see (another host or container): stopped, dead, or starved by a call holding the GIL",
          "named at once, no stack; aborted if still no progress", "60 s without progress", "silent"),
    State(STARVED, "its watchdog thread does not answer the probe, but its process is running or sleeping: a "
          "long call that holds the GIL (a large pickle.load, a C extension) starves the thread, or its node is cut "
          "off from the store", "reported as busy; looked at again every 10 s; aborted if still no progress",
          "60 s without progress", "silent"),
    State(OUT_OF_ORDER, "it is inside another collective than the one the others wait in (a skipped call, "
          "another op or size), or waits inside one the others have left", "named; the job is aborted",
          "the verdict (~15 s)", "now"),
    State(STUCK, "it answers, but between two looks its main thread neither ran nor waited for a CPU and its "
          "stack did not "
          "change, outside the others' collective (a deadlocked data loader, a hung file system call) - or "
          "every rank answers from inside the same collective",
          "named with its stack at the verdict; aborted if still no progress",
          "NPUDIST_STUCK_TIMEOUT, 300 s without progress", "stuck"),
    State(BUSY, "it answers, and its main thread ran or waited for a CPU, or its stack changed, between the "
          "two looks "
          "(rank 0 evaluating, a synchronous checkpoint, a compile)",
          "reported once (where, how long); looked at again every 10 s; never aborted by npudist",
          "never (the collective timeout, 600 s by default, still ends the job); NPUDIST_BUSY_TIMEOUT if set",
          "busy"),
    State(DECLARED, "it runs inside `with npudist.busy(\"what\"):` (an inference front waiting for requests, "
          "a checkpoint load)", "reported once as expected; never aborted by npudist",
          "as busy", "busy"),
)})


@dataclass(frozen=True)
class Look:
    """A live rank's answer to the probe: its main thread looked at twice, ``span_s`` apart."""

    stack: str
    cpu_s: float = 0.0
    """Main-thread CPU seconds used between the two looks."""
    ready_s: float = 0.0
    """Seconds it was runnable but waited for a CPU (a loaded host), between the two looks."""
    span_s: float = 0.0
    moved: bool = False
    """The two stacks differ."""
    busy: str = ""
    """The label of the npudist.busy() block it is in ("" when none)."""
    busy_s: float = 0.0
    """Seconds inside that block."""

    def to_json(self) -> str:
        return json.dumps({"stack": self.stack, "cpu_s": self.cpu_s, "ready_s": self.ready_s, "span_s": self.span_s,
                           "moved": self.moved, "busy": self.busy, "busy_s": self.busy_s})

    @property
    def cpu_ratio(self) -> float:
        return self.cpu_s / self.span_s if self.span_s > 0 else 0.0

    @property
    def run_ratio(self) -> float:
        """On a CPU or waiting for one, over wall time."""
        return (self.cpu_s + self.ready_s) / self.span_s if self.span_s > 0 else 0.0


def parse_look(raw: bytes | str) -> Look:
    """A probe answer; anything that is not one of ours is kept as a bare stack (never raises)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return Look(stack=text)
    if not isinstance(doc, dict) or not isinstance(doc.get("stack"), str):
        return Look(stack=text)

    def num(key: str) -> float:
        v = doc.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else 0.0

    busy = doc.get("busy")
    return Look(stack=doc["stack"], cpu_s=max(0.0, num("cpu_s")), ready_s=max(0.0, num("ready_s")),
                span_s=max(0.0, num("span_s")),
                moved=doc.get("moved") is True, busy=busy[:200] if isinstance(busy, str) else "",
                busy_s=max(0.0, num("busy_s")))


def classify(*, out_of_order: bool, closed: bool, probed: bool, look: Look | None,
             process: str | None = None, inside_passed: bool = False) -> str:
    """The state of one rank the others wait for (see STATES).

    ``process``: what the reader's process table says of it when the rank's pid means something there (the
    same kernel and pid namespace: process_table.py): "gone", "stopped", "alive", or None when unknown.
    ``inside_passed``: its record says it is inside a collective that the
    others have left; waiting there (not running) it can never return, since they will not come back.
    An asynchronous call stays "inside" until its wait, so a rank that runs there is busy, not out of order.
    """
    if out_of_order:
        return OUT_OF_ORDER
    if closed or process == PROCESS_GONE:
        return GONE
    if not probed:
        return UNPROBED
    if look is None:
        return {PROCESS_STOPPED: STOPPED, PROCESS_ALIVE: STARVED}.get(process or "", SILENT)
    if look.busy:
        return DECLARED
    if look.moved or look.run_ratio >= BUSY_CPU_RATIO:
        return BUSY
    return OUT_OF_ORDER if inside_passed else STUCK


def describe(state: str, look: Look | None, process: str | None = None) -> str:
    """The state's words in a verdict line; the phrases before the colon are stable (tests, log searches)."""
    if state == STOPPED:
        return ("did not answer: stopped (process state: stopped), no stack (its record lags its last call by up "
                "to a second)")
    if state == SILENT:
        return ("did not answer: stopped, dead or starved, no stack; its process is not in this host's process "
                "table, so it is not looked at")
    if state == STARVED:
        return ("did not answer, but its process runs: its watchdog thread is starved (a long call that holds "
                "the GIL?)")
    if state == GONE:
        return "gone: its process exited or shut npudist down" if process == "gone" else "no watchdog left to answer"
    if state == UNPROBED or look is None:
        return "not probed"
    if state == DECLARED:
        return f"answered: declared busy in {look.busy!r} for {look.busy_s:.0f} s"
    if state == BUSY:
        how = f"main thread at {100 * min(look.cpu_ratio, 1.0):.0f} % CPU"
        if look.ready_s / max(look.span_s, 1e-9) >= 0.05:
            how += f", {100 * min(look.ready_s / look.span_s, 1.0):.0f} % waiting for one (a loaded host)"
        how += ", stack moving" if look.moved else ""
        return f"answered: live and busy ({how})"
    if state == STUCK:
        return f"answered: live but stuck (same stack, neither on nor waiting for a CPU over {look.span_s:.1f} s)"
    if state == OUT_OF_ORDER:
        return "answered: live, but out of order (it waits in a collective the others are not in)"
    return state


def abort_after(states: list[str], *, stuck_s: float, busy_s: float | None,
                silent_s: float = SILENT_ABORT_S) -> float | None:
    """Seconds of stall after which the job is aborted given its culprits' states (0: now; None: never)."""
    kinds = {STATES[s].abort for s in states if s in STATES}
    if "now" in kinds:
        return 0.0
    if "silent" in kinds or "stuck" in kinds:
        return min(silent_s if "silent" in kinds else stuck_s, stuck_s if "stuck" in kinds else silent_s)
    return busy_s if "busy" in kinds else None
