"""What rank 0 prints while a job trains: the progress line, and the one line Ctrl-C ends a run with.

Formatting is pure (``duration``, ``progress``, ``step_line``, ``interrupted_line``); ``Interrupt`` is the
SIGINT handling the line needs. The watched loop (loop.py) prints these for any script; the example
(examples/train_ddp.py) prints the same lines.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Sequence


def duration(seconds: float) -> str:
    """42s, 3m05s, 1h02m: short enough for a progress line."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress(step: int, total: int | None, start: int, began: float, now: float) -> str:
    """``done=N/TOTAL elapsed=.. eta=..``.

    ``began`` is when this process started training (taken once, not per step), ``start`` the step it
    started from: the ETA extrapolates this process's own steps, never resumed ones. Without a total there
    is no ETA (``done=N elapsed=..``); a step past the total has none either.
    """
    elapsed = max(0.0, now - began)
    if total is None or step > total:
        return f"done={step} elapsed={duration(elapsed)}"
    ran = step - start
    eta = elapsed / ran * (total - step) if ran > 0 else math.nan
    return f"done={step}/{total} elapsed={duration(elapsed)} eta={'?' if math.isnan(eta) else duration(eta)}"


def step_line(step: int, *, loss: float | None, samples_per_second: float | None, done: str,
              where: Sequence[tuple[str, str]]) -> str:
    """``step=N loss=L samples/s=R done=.. elapsed=.. eta=.. world=W accelerator=A backend=B``: a value not
    known (a loop that logs no loss, a batch of unknown size) is left out rather than printed as 0."""
    parts = [f"step={step}"]
    if loss is not None:
        parts.append(f"loss={loss:.4f}")
    if samples_per_second is not None:
        parts.append(f"samples/s={samples_per_second:.1f}")
    parts.append(done)
    parts.extend(f"{k}={v}" for k, v in where)
    return " ".join(parts)


def interrupted_line(step: int, checkpoint: str | None, *, resumable: bool = True) -> str:
    """``interrupted at step N; last checkpoint C; run the same command to resume``."""
    line = f"interrupted at step {step}; last checkpoint {checkpoint or 'none'}"
    return line + ("; run the same command to resume" if resumable else "")


class Interrupt:
    """Ctrl-C (or torchrun passing on a SIGINT) at any phase ends with one line, from rank 0.

    The first SIGINT raises KeyboardInterrupt and is remembered; later ones only are (a second Ctrl-C, or the
    launcher's copy of the terminal's) so nothing interrupts the line or the teardown. Remembering matters
    because a rank blocked in a collective runs no Python signal handler until the collective returns, and it
    often returns with an error first: the peer that got the same SIGINT already left. That error is the
    interruption, not a failure (Python runs handlers between bytecodes only: docs.python.org/3/library/
    signal.html#execution-of-python-signal-handlers)."""

    def __init__(self) -> None:
        self.requested = False
        self.previous = signal.signal(signal.SIGINT, self._first)

    def _first(self, _signum: int, _frame: object) -> None:
        self.note(_signum, _frame)
        raise KeyboardInterrupt

    def note(self, _signum: int, _frame: object) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self.note)

    def caused(self, exc: BaseException | None) -> bool:
        """Whether ``exc`` ends the run because of Ctrl-C (itself, or a collective a leaving peer broke)."""
        signal.signal(signal.SIGINT, self.note)  # first: a SIGINT still pending now only notes
        return self.requested or isinstance(exc, KeyboardInterrupt)

    def restore(self) -> None:
        """Give SIGINT back to the handler that was there before (safe to call again)."""
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None
