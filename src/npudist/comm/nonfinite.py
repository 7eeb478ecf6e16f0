"""A non-finite flag that rides in DDP's last gradient bucket: every rank learns of a NaN/Inf on any rank
without a collective of its own.

npudist.ddp's comm hook (ddp.py) hands each bucket to ``NonFiniteFold.before_reduce`` before reducing it.
On the last bucket of a backward (``GradBucket.is_last()``: DDP reduces buckets in index order) a rank whose
loss is not finite (the backward's root, which the sentinel records, npudist/training/sentinel.py) writes NaN into
the bucket's first element. The reduction is a sum, and NaN + anything is NaN, so after it every rank holds
the same first element: finite on every rank, or NaN on every rank. Reading that one element after the
backward (``reduced``, then ``take``) is the agreed flag, with no extra collective and no extra bytes on the
wire (Megatron and DeepSpeed all-reduce a flag of their own; ``TORCH_NCCL_NAN_CHECK`` scans every input on
the device). A gradient whose first element is already non-finite raises the same flag.

Scan mode (opt-in) also checks every bucket of this rank before it is reduced (one summing pass over the
gradients; Megatron checks each bucket's norm), so the rank and its first non-finite bucket are known.

On a CPU bucket the flags are plain Python values; on an accelerator they stay device tensors (a masked
fill, a one-element copy) until the optimizer step reads the flag, so the backward never waits for the
device.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

MODES = ("loss", "scan", "off")
"""loss (default): the loss and the first element of the last bucket; scan: also every bucket on this rank
before its reduction; off: nothing."""


@dataclass(frozen=True)
class LocalFinding:
    """What this rank saw before the reduction: its loss, and in scan mode its first non-finite bucket."""

    loss: float | None
    """The backward's root when it was not finite (None: finite, or not a scalar)."""
    bucket: int | None = None
    """Scan mode: the first bucket (DDP's index) holding a non-finite gradient on this rank."""
    parameters: tuple[torch.Tensor, ...] = ()
    """That bucket's parameters (their names come from the model)."""


def _is_bad(value: Any) -> bool:
    """A Python bool, or a device tensor holding one (read now: the caller decided it may wait)."""
    return bool(value.item()) if isinstance(value, torch.Tensor) else bool(value)


class NonFiniteFold:
    """One process's flag state, shared by every npudist.ddp model the sentinel watches.

    ``root`` is the loss of the backward in progress (set by the sentinel's backward hook). ``on_skip`` is
    called with True when a backward's agreed flag was never taken by an optimizer step before the next
    backward: a GradScaler skipped that step.
    """

    def __init__(self, mode: str = "loss", on_skip: Callable[[bool], None] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"non-finite check mode {mode!r}: choose one of {', '.join(MODES)}")
        self.mode = mode
        self.on_skip = on_skip
        self.root: torch.Tensor | None = None
        self.root_value: float | None = None
        """The last root's value where it was read anyway (a CPU bucket): the spike rule reuses it."""
        self._first: tuple[torch.Tensor, Any] | None = None
        """(bucket buffer, a NumPy view of it): reading element 0 of a CPU buffer through the view costs a
        few hundred instructions, through the tensor a dispatched select and item (tens of thousands)."""
        self._loss_bad: Any = False
        self._scan: list[tuple[int, Any, tuple[torch.Tensor, ...]]] = []
        self._last: torch.Tensor | None = None
        self._pending: Any = None
        """The last backward's agreed flag (bool, or a one-element device tensor), until taken."""
        self._local: tuple[Any, Any, list[tuple[int, Any, tuple[torch.Tensor, ...]]]] | None = None

    # inside the backward (the comm hook) ----------------------------------------------------------------
    def before_reduce(self, bucket: Any, buf: torch.Tensor) -> None:
        """The comm hook's call for each bucket, before the reduction is issued."""
        if self.mode == "scan":
            # A sum is one vectorised pass with no bool tensor as large as the bucket (isfinite(buf).all() cost
            # four times as much here); NaN or Inf anywhere makes it non-finite. Half-precision buckets sum in
            # float32, so a sum of finite gradients cannot overflow to inf.
            total = buf.sum(dtype=torch.float32) if buf.element_size() < 4 else buf.sum()
            bad = (not math.isfinite(total.item())) if buf.is_cpu else ~torch.isfinite(total)
            if bad is not False:
                self._scan.append((bucket.index(), bad, tuple(bucket.parameters())))
        if not bucket.is_last():
            return
        if self._pending is not None:  # the last backward's flag was never taken: no optimizer step ran
            pending, self._pending = self._pending, None
            if self.on_skip is not None:
                self.on_skip(_is_bad(pending))
        root, self.root = self.root, None
        on_cpu = buf.is_cpu
        loss_bad: Any = False
        if root is not None and root.numel() == 1:
            if on_cpu:
                self.root_value = value = root.item()
                loss_bad = not math.isfinite(value)
            else:
                loss_bad = ~torch.isfinite(root.detach().reshape(()).to(buf.device))
        bad = loss_bad
        for _, scanned, _ in self._scan:
            bad = (bad or scanned) if on_cpu else scanned if bad is False else bad | scanned
        if on_cpu:
            if bad:
                buf[0] = math.nan
        elif bad is not False:
            buf[:1].masked_fill_(bad, math.nan)
        self._local = (root if loss_bad is not False else None, loss_bad, self._scan)
        self._scan = []
        self._last = buf

    def reduced(self) -> None:
        """The backward's buckets are all reduced: keep the agreed flag (the last bucket's first element)."""
        buf, self._last = self._last, None
        if buf is None:
            return
        if buf.is_cpu:
            self._pending = not math.isfinite(self._read_first(buf))
        else:
            self._pending = ~torch.isfinite(buf[:1].clone())

    def _read_first(self, buf: torch.Tensor) -> float:
        cached = self._first
        if cached is None or cached[0] is not buf:
            view = None
            with contextlib.suppress(RuntimeError, TypeError, ValueError):  # no NumPy, or no bfloat16 in it
                view = buf.detach().numpy()
            self._first = cached = (buf, view)
        view = cached[1]
        return float(view[0]) if view is not None else buf[0].item()

    # at the optimizer step ------------------------------------------------------------------------------
    def take(self) -> bool | None:
        """The agreed flag of the backward just finished (None: no bucket was reduced since the last take);
        reading it waits for the device on an accelerator."""
        pending, self._pending = self._pending, None
        return None if pending is None else _is_bad(pending)

    def local(self) -> LocalFinding:
        """What this rank itself saw in the last flagged backward (for the stop line; reads device flags)."""
        root, loss_bad, scanned = self._local or (None, False, [])
        loss = float(root.detach().float().reshape(())) if root is not None and _is_bad(loss_bad) else None
        for index, bad, params in sorted(scanned, key=lambda s: s[0]):
            if _is_bad(bad):
                return LocalFinding(loss, index, params)
        return LocalFinding(loss)


def first_nan(state: Any, prefix: str = "") -> str | None:
    """The name of the first floating tensor in ``state`` (nested dicts and lists, as a checkpoint holds)
    that contains NaN, else None. NaN only: an attention mask buffer may hold -inf by design."""
    if isinstance(state, torch.Tensor):
        if hasattr(state, "to_local"):  # a DTensor shard: this rank's part (a reduction over it would communicate)
            state = state.to_local()
        if state.is_floating_point() and bool(torch.isnan(state).any()):
            return prefix or "tensor"
        return None
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, (list, tuple)) \
        else ()
    for key, value in items:
        found = first_nan(value, f"{prefix}.{key}" if prefix else str(key))
        if found is not None:
            return found
    return None


__all__ = ["MODES", "LocalFinding", "NonFiniteFold", "first_nan"]
