"""TensorBoard event files of the watched loop's numbers, through torch's own ``SummaryWriter``.

Asked for with ``npudist launch --tensorboard DIR`` (the ranks get NPUDIST_TENSORBOARD=DIR) or
``npudist.loop(tensorboard=DIR)``. Rank 0 writes what its progress line and run log record, at the same
steps: ``loss``, ``samples_per_second`` and every name given to ``npudist.log``. The other ranks write
nothing (their numbers are in the run log and the rank metrics).

torch.utils.tensorboard needs the ``tensorboard`` package, which npudist does not require: it is the
optional extra ``npudist[tensorboard]``. Without it the request fails at once with what to install,
before any rank starts when ``npudist launch`` was asked.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

INSTALL = "pip install 'npudist[tensorboard]' (or pip install tensorboard)"


class TensorBoardMissing(RuntimeError):
    """--tensorboard was asked for where the tensorboard package is not installed."""


def missing_message(directory: str) -> str | None:
    """Why TensorBoard files cannot be written to ``directory`` here (None: they can)."""
    try:
        found = importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        found = False
    if found:
        return None
    return (f"--tensorboard {directory} needs the tensorboard package, which is not installed in this Python "
            f"environment: {INSTALL}; or leave --tensorboard out (the run log and `npudist report` need nothing)")


class TensorBoardScalars:
    """A SummaryWriter on ``directory`` that takes the loop's numbers of one step."""

    def __init__(self, directory: str) -> None:
        why = missing_message(directory)
        if why is not None:
            raise TensorBoardMissing(why)
        from torch.utils.tensorboard import SummaryWriter

        self.directory = directory
        self._writer: Any = SummaryWriter(log_dir=directory)

    def write(self, step: int, scalars: Mapping[str, float | None]) -> None:
        """Each known value under its own name; None (not recorded, not finite) is left out."""
        for name, value in scalars.items():
            if value is not None:
                self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()  # flushes the events file
            self._writer = None


__all__ = ["INSTALL", "TensorBoardMissing", "TensorBoardScalars", "missing_message"]
