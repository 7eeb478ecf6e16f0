"""The two places any PyTorch loop passes through, hooked for the watched loop (loop.py).

- The end of a step: torch's global optimizer post-step hook
  (``torch.optim.optimizer.register_optimizer_step_post_hook``, torch >= 2.0), so optimizers the script
  made before or after ``npudist.init()`` are all seen without the script handing them over. Its cost per
  step is one Python call and an ``id`` comparison.
- A batch's arrival: ``__next__`` of ``torch.utils.data.dataloader._BaseDataLoaderIter``, the base of the
  single- and multi-process iterators every ``DataLoader`` returns, wrapped with two clock reads. Python
  looks ``__next__`` up on the type, so the iterator a script already holds is timed too; the script's
  DataLoader stays the plain object it made (no proxy whose attributes could differ).

Both are process-wide, so ``install`` returns the function that removes them and the Runtime calls it at
``npudist.shutdown()``; a ``__next__`` that someone else replaced after us is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("npudist.telemetry")

Uninstall = Callable[[], None]


def install(loop: Any, clock: Callable[[], float] = time.perf_counter) -> Uninstall:
    """Hook ``loop`` (a TrainingLoop) into every optimizer step and DataLoader batch of this process."""
    import torch.optim.optimizer as optimizer_module
    from torch.utils.data import dataloader

    def after_step(optimizer: Any, _args: Any, _kwargs: Any) -> None:
        try:
            loop.optimizer_stepped(optimizer)
        except Exception as exc:  # telemetry must never break the user's step
            log.warning("npudist step accounting failed: %s", exc)

    handle = optimizer_module.register_optimizer_step_post_hook(after_step)
    base = dataloader._BaseDataLoaderIter
    original = base.__dict__["__next__"]

    def __next__(self: Any) -> Any:
        at = clock()
        batch = original(self)  # StopIteration ends the epoch as before, and is not a batch
        try:
            length = None
            if getattr(self, "_num_yielded", None) == 1:  # the epoch's first batch: read its length once
                with contextlib.suppress(TypeError):  # an IterableDataset without __len__
                    length = len(self)
            loop.fetched(batch, clock() - at, at, length)
        except Exception as exc:
            log.warning("npudist data-time accounting failed: %s", exc)
        return batch

    __next__.__wrapped__ = original  # type: ignore[attr-defined]
    base.__next__ = __next__

    def uninstall() -> None:
        handle.remove()
        if base.__dict__.get("__next__") is __next__:
            base.__next__ = original

    return uninstall
