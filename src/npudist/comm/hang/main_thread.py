"""What a probed rank says of its main thread: its Python stack and whether it runs (rank_states.py judges).

The rank's own watchdog thread takes the looks, so they cost the training loop nothing until a probe asks.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable

from npudist.diagnosis import rank_states
from npudist.diagnosis.rank_states import Look

STACK_CHARS = 4000
"""A probed rank's stack is cut to its innermost frames within this many characters."""


def main_cpu_s() -> float:
    """CPU seconds of the main thread (the process's where the platform has no per-thread clock)."""
    ident = threading.main_thread().ident
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))  # type: ignore[arg-type]
    except (AttributeError, OSError, TypeError):
        return time.process_time()


def main_ready_s(path: str | None = None) -> float:
    """Seconds the main thread has been runnable but waiting for a CPU (Linux schedstat's run delay, in ns;
    0 where the kernel has no schedstat): on a loaded host a running loop gets little CPU but waits for it."""
    path = path or f"/proc/self/task/{threading.main_thread().native_id}/schedstat"
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def look_at_main(busy: tuple[str, float] | None, wait: Callable[[float], object]) -> Look:
    """Two looks at the main thread, rank_states.SAMPLE_GAP_S apart: does it run, does its stack move."""
    t0, cpu0, ready0, stack0 = time.monotonic(), main_cpu_s(), main_ready_s(), main_stack()
    wait(rank_states.SAMPLE_GAP_S)
    t1, cpu1, ready1, stack1 = time.monotonic(), main_cpu_s(), main_ready_s(), main_stack()
    label, since = busy or ("", 0.0)
    return Look(stack=stack1, cpu_s=max(0.0, cpu1 - cpu0), ready_s=max(0.0, ready1 - ready0), span_s=t1 - t0,
                moved=stack1 != stack0, busy=label, busy_s=max(0.0, time.monotonic() - since) if label else 0.0)


def main_stack() -> str:
    """The main thread's Python stack, innermost frames last, cut to STACK_CHARS."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return ""
    text = "".join(traceback.format_stack(frame))
    return text[-STACK_CHARS:]


