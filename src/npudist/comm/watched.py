"""watched(): every public collective numbered for the hang watchdog, its failures diagnosed.

Around each call the CommState's Watchdog (watchdog.py) marks the call entered and done; a timeout or a
lost peer becomes CollectiveHangError naming the ranks that never reached the call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from npudist.comm.hang.watchdog import Watchdog
from npudist.comm.state import state
from npudist.runtime.compat import DIST_ERRORS, is_dist_error


class _WatchedHandle:
    """An async collective's handle whose wait() also reports completion or diagnoses a hang."""

    def __init__(self, inner: Any, watchdog: Watchdog, op: str, seq: int, nbytes: int) -> None:
        self._inner, self._watchdog, self._op, self._seq, self._nbytes = inner, watchdog, op, seq, nbytes

    @property
    def result(self) -> Any:
        return self._inner.result

    @property
    def seconds(self) -> float | None:
        return self._inner.seconds

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def get_future(self) -> Any:
        """The inner handle's future, marking this collective done when it completes. A failure stays the
        backend's error here (a future's callback cannot carry our exception type through C++);
        ``wait()`` afterwards diagnoses it and raises CollectiveHangError."""
        watchdog, seq = self._watchdog, self._seq
        return self._inner.get_future(lambda: watchdog.done(seq))

    def wait(self, timeout: float | None = None) -> bool:
        try:
            out = self._inner.wait(timeout) if timeout is not None else self._inner.wait()
        except DIST_ERRORS as exc:
            if not communication_failure(exc):
                raise
            err = self._watchdog.diagnose(self._op, self._seq, self._nbytes, exc)
            if err is None:
                raise
            raise err from exc
        self._watchdog.done(self._seq)
        return out


def _size(t: object) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _nbytes(args: tuple, kwargs: dict) -> int:
    """Payload bytes, for the record only: bad arguments are the collective's to reject, not ours."""
    first = args[0] if args else kwargs.get("t", kwargs.get("tensors"))
    if isinstance(first, list | tuple):
        return sum(_size(t) for t in first)
    return _size(first)


def communication_failure(exc: BaseException) -> bool:
    """Timeouts and lost peers come as torch's DistError or a plain RuntimeError from the backend; our
    own errors (MismatchError, TypeError, ValueError) already say what is wrong and pass through."""
    return is_dist_error(exc) or type(exc) is RuntimeError


def watched(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its calls numbered and recorded, and failures turned into CollectiveHangError."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        watchdog = state().watchdog
        nbytes = _nbytes(args, kwargs)
        seq = watchdog.enter(op, nbytes)
        try:
            out = fn(*args, **kwargs)
        except DIST_ERRORS as exc:
            if not communication_failure(exc):
                raise
            err = watchdog.diagnose(op, seq, nbytes, exc)
            if err is None:
                raise
            raise err from exc
        if kwargs.get("async_op") and hasattr(out, "wait"):
            return _WatchedHandle(out, watchdog, op, seq, nbytes)
        watchdog.done(seq)
        return out

    return call
