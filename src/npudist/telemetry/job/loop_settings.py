"""What a watched loop is configured with (``npudist.loop(...)``'s LoopSettings) and the pure rules it
follows: the ETA's total from a script's own flags, a batch's size, a resumed optimizer's step count, which
steps get a progress line, and a logged value read as a number. The loop itself is loop.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

TIME_BETWEEN_LINES_S = 30.0
"""Without a total or --log-every, a progress line at most this often (and at the first step)."""
LINES_PER_RUN = 10
"""With a total and no --log-every, about this many progress lines over the run."""

MAX_NAMES = 64
"""Names npudist.log accepts (runlog_schema.MAX_NAMES: what one run-log record may carry)."""
MAX_NAME = 64
"""Characters in one name."""

STEPS_FLAGS = ("--steps", "--max-steps", "--max_steps", "--total-steps", "--total_steps", "--num-steps",
               "--num_steps", "--train-steps", "--train_steps", "--iterations", "--iters")
"""A script's own flags that give its number of optimizer steps: the ETA's total when none is configured."""
EPOCHS_FLAGS = ("--epochs", "--num-epochs", "--num_epochs", "--max-epochs", "--max_epochs")
"""Flags that give its number of epochs: with the DataLoader's length, the total."""


@dataclass(frozen=True, kw_only=True)
class LoopSettings:
    """What ``npudist.loop(...)`` configures; every field has a default that works for a plain loop."""

    total_steps: int | None = None
    """The step the run ends at (the ETA's target); None: the script's --steps-like flag, else the
    DataLoader's length times its --epochs-like flag (one epoch without one), else no ETA."""
    start_step: int | None = None
    """The step this process resumes after; None: the first optimizer's own step count, else 0."""
    log_every: int | None = None
    """Steps between progress lines; None: about LINES_PER_RUN lines with a total, else every 30 s."""
    samples_per_step: int | None = None
    """Samples in one step over all ranks (samples/s); None: the batch's first dimension times the world."""
    run_dir: str | None = None
    """Where the run log goes (RUN_DIR/metrics/rank{R}.jsonl); None: NPUDIST_RUN_DIR, else no run log."""
    exchange_every: int = 20
    """Steps per skew window (every rank must use the same value)."""
    op_every: int = 100
    """Steps between profiled steps for operator times (0: never)."""
    op_ranks: int = 0
    """Profile operators on about this many ranks (0: every rank)."""
    straggler_diagnosis: int = 0
    """With a run directory: write RUN_DIR/straggler-step*.json after this many flagged windows (0: off)."""
    telemetry: bool = True
    """False: no metrics, step timer or skew exchange (the console and run log only)."""
    resume_source: str | None = None
    """Where the resumed state came from (the run log's start record)."""
    tensorboard: str | None = None
    """Rank 0 writes TensorBoard event files of the line's numbers here (needs the tensorboard package);
    None: NPUDIST_TENSORBOARD (``npudist launch --tensorboard DIR``), else none."""

    def __post_init__(self) -> None:
        for name in ("total_steps", "start_step", "log_every", "samples_per_step"):
            value = getattr(self, name)
            low = 0 if name == "start_step" else 1
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"npudist.loop: {name}={value!r}; give an integer >= {low} or None")
        for name in ("exchange_every", "op_every", "op_ranks", "straggler_diagnosis"):
            if getattr(self, name) < 0:
                raise ValueError(f"npudist.loop: {name} must be >= 0 (0 turns it off)")


SETTING_NAMES = frozenset(f.name for f in fields(LoopSettings))


def flag_value(argv: Sequence[str], names: Sequence[str]) -> int | None:
    """The positive integer after the last of ``names`` in ``argv`` (``--steps 100`` or ``--steps=100``)."""
    found = None
    for i, tok in enumerate(argv):
        name, eq, value = tok.partition("=")
        if name not in names:
            continue
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        if value.isdigit() and int(value) > 0:
            found = int(value)
    return found


def total_hint(argv: Sequence[str], loader_length: int | None) -> int | None:
    """The ETA's total for a script that configured none: its --steps-like flag, else its DataLoader's
    length times its --epochs-like flag (one epoch without one), else None."""
    steps = flag_value(argv, STEPS_FLAGS)
    if steps is not None:
        return steps
    if loader_length is None or loader_length < 1:
        return None
    return loader_length * (flag_value(argv, EPOCHS_FLAGS) or 1)


def batch_size_of(batch: Any) -> int | None:
    """Samples in a batch: a tensor's first dimension, else that of the first tensor in a tuple, list or
    dict (features, labels); None when there is none."""
    for _ in range(3):  # (inputs, labels), {"input_ids": ...}, [[...]]: a few levels, never a deep walk
        shape = getattr(batch, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) else None
        if isinstance(batch, Mapping):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (tuple, list)):
            batch = batch[0] if batch else None
        else:
            return None
    return None


def optimizer_step_count(optimizer: Any) -> int | None:
    """The step count an optimizer keeps per parameter (Adam, AdamW, RMSprop, Adagrad...: ``state[p]
    ["step"]``), read once at its first step: a loaded state_dict carries it, so a resumed script's steps
    continue without telling npudist where it resumed. None for one that keeps none (SGD)."""
    try:
        for group in optimizer.param_groups:
            for p in group["params"]:
                value = optimizer.state.get(p, {}).get("step")
                if value is not None:
                    return int(float(value))
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError):
        return None
    return None


def line_due(step: int, *, total: int | None, log_every: int | None, since_line_s: float) -> bool:
    """Whether step ``step`` gets a progress line: the first, every ``log_every``-th, the last; without
    ``log_every`` about LINES_PER_RUN over a known total, else one per TIME_BETWEEN_LINES_S."""
    if step == 1 or step == total:
        return True
    if log_every is None and total is not None:
        log_every = max(1, total // LINES_PER_RUN)
    if log_every is not None:
        return step % log_every == 0
    return since_line_s >= TIME_BETWEEN_LINES_S


def scalar(value: Any) -> float | None:
    """A logged value as a finite float (a tensor is read only now, when a line or record needs it)."""
    try:
        out = float(value.detach()) if hasattr(value, "detach") else float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return out if math.isfinite(out) else None
