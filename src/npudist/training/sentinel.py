"""The NaN/Inf and loss-spike sentinel, on by default for every model made by ``npudist.ddp``.

Where the loss comes from: the root of each backward. ``torch.Tensor.backward`` is wrapped (process-wide,
removed at ``npudist.shutdown()``) to note the tensor a plain loop calls ``loss.backward()`` on, and
``torch.amp.GradScaler.scale`` to note the unscaled loss under a scaler. That needs nothing from the
script (no ``npudist.log``, which loops call after the step, too late to stop the update) and costs one
Python call per backward. ``torch.autograd.backward(loss)`` is not seen; its gradients still raise the flag
through the last bucket's first element, and scan mode checks every bucket.

How the ranks agree: the flag rides in DDP's last gradient bucket (npudist/comm/nonfinite.py), so every
rank reads the same flag after its backward, with no collective of its own. It is read by a global
optimizer pre-step hook, so a flagged step never reaches its optimizer update: every rank raises
NonFiniteError there, in the same step, and rank 0 prints one line naming the rank(s), host, card, step
and first non-finite bucket (one ``all_gather_object``, on this failure path only). The model keeps its
last finite state, and ``npudist.checkpoint.save`` refuses to write after a stop or a state holding NaN.

A GradScaler that finds non-finite gradients skips ``optimizer.step()`` itself, so the pre-step hook never
sees that flag: the skip is counted (diagnosis/nonfinite.py's SkipStreak) and the job goes on.

Without npudist.ddp (FSDP2, a single process) there is no bucket to carry the flag; the sentinel then does
nothing, rather than add a collective to every step.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from npudist.diagnosis.nonfinite import Culprit, NonFiniteStop, SkipStreak, SpikeRule

FILE = "nonfinite-step{step}.json"
"""Rank 0's record of a stop in the run directory (`npudist report` and `npudist diagnose` read it)."""


class NonFiniteError(RuntimeError):
    """Every rank raises it in the same step when any rank's loss or gradients went NaN/Inf; its message is
    the line naming the rank(s), host, card and step."""

    def __init__(self, stop: NonFiniteStop) -> None:
        super().__init__(stop.line())
        self.stop = stop


def _card(ctx: Any) -> str:
    device = ctx.device
    return str(device) if getattr(device, "index", None) is not None else f"{device.type} (local rank {ctx.local_rank})"


class Sentinel:
    """One process's sentinel: ``watch`` each npudist.ddp model, ``install`` the hooks once (the returned
    function removes them). ``write`` prints a line (stderr by default); ``step_of`` gives the training step
    in progress."""

    def __init__(self, ctx: Any, *, mode: str = "loss", spike_factor: float = 10.0, skip_warn: int = 20,
                 run_dir: str | None = None, write: Callable[[str], None] | None = None,
                 step_of: Callable[[], int | None] | None = None) -> None:
        from npudist.comm.nonfinite import NonFiniteFold

        self.ctx = ctx
        self.run_dir = run_dir
        self.write = write or _stderr
        self.step_of = step_of or (lambda: None)
        self.fold = NonFiniteFold(mode, on_skip=self._skipped)
        self.spike = SpikeRule(spike_factor)
        self.skips = SkipStreak(skip_warn)
        self.stopped: NonFiniteStop | None = None
        self.steps = 0
        """Optimizer steps taken (the step number where no watched loop numbers them)."""
        self.loop_catches: Callable[[], bool] = lambda: False
        """Whether a started watched loop's excepthook says the stop (then this one leaves it to that)."""
        self._models: list[Any] = []
        self._loss: Any = None
        self._installed = False
        self._hooked: tuple[Callable[..., None], Callable[..., None]] | None = None

    def watch(self, model: Any) -> None:
        from npudist.comm.ddp import gradient_sync

        gradient_sync(model).nonfinite = self.fold
        self._models.append(model)

    def step(self) -> int:
        """The training step in progress."""
        loop_step = self.step_of()
        return (loop_step if loop_step is not None else self.steps) + 1

    # hooks --------------------------------------------------------------------------------------------------
    def install(self) -> Callable[[], None]:
        import torch
        import torch.optim.optimizer as optimizer_module

        if self._installed:
            return lambda: None
        self._installed = True
        fold = self.fold
        original_backward = torch.Tensor.backward

        def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            fold.root = tensor
            if self._loss is None or self._loss[1] is not tensor:
                self._loss = (tensor, tensor)
            return original_backward(tensor, *args, **kwargs)

        backward.__wrapped__ = original_backward  # type: ignore[attr-defined]
        torch.Tensor.backward = backward
        # torch.amp.GradScaler since torch 2.3; before, the scaler was torch.cuda.amp's (the only one).
        scaler_class = getattr(torch.amp, "GradScaler", None) or torch.cuda.amp.GradScaler
        original_scale = scaler_class.scale

        def scale(scaler: Any, outputs: Any) -> Any:
            scaled = original_scale(scaler, outputs)
            if hasattr(outputs, "numel") and hasattr(scaled, "numel"):
                self._loss = (outputs, scaled)  # the spike rule reads the unscaled loss
            return scaled

        scale.__wrapped__ = original_scale  # type: ignore[attr-defined]
        scaler_class.scale = scale
        handle = optimizer_module.register_optimizer_step_pre_hook(self._before_step)

        def uninstall() -> None:
            handle.remove()
            self._restore_excepthook()
            if torch.Tensor.__dict__.get("backward") is backward:
                torch.Tensor.backward = original_backward
            if scaler_class.__dict__.get("scale") is scale:
                scaler_class.scale = original_scale
            for model in self._models:
                from npudist.comm.ddp import gradient_sync

                gradient_sync(model).nonfinite = None
            self._installed = False

        return uninstall

    def _skipped(self, flagged: bool) -> None:
        line = self.skips.skipped(flagged, self.step())
        if line is not None:
            self.write(line)

    def _before_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        flagged = self.fold.take()
        if flagged is None:
            return  # a second optimizer in the same step, or no npudist.ddp backward
        step = self.step()
        self.steps += 1
        if flagged:
            self.stop(step)
        self.skips.stepped()
        loss, self._loss, known = self._loss, None, self.fold.root_value
        self.fold.root_value = None
        if loss is not None and loss[0].numel() == 1:
            # The root's value where the fold read it (no GradScaler: the root is the loss), else one read.
            value = known if known is not None and loss[0] is loss[1] else loss[0].item()
            line = self.spike.check(step, value, self.ctx.rank)
            if line is not None:
                self.write(line)

    # the stop -----------------------------------------------------------------------------------------------
    def stop(self, step: int) -> None:
        """Every rank is here in the same step (the flag is agreed): gather the culprits, say it, raise."""
        from npudist.comm import control

        found = self.fold.local()
        mine = None
        if found.loss is not None or found.bucket is not None:
            first = None
            if found.bucket is not None:
                names = self._names(found.parameters)
                first = f"bucket {found.bucket}" + (f" ({names[0]})" if names else "")
            mine = Culprit(rank=self.ctx.rank, host=socket.gethostname(), card=_card(self.ctx),
                           loss=found.loss, first=first)
        culprits = tuple(c for c in control.gather_objects(mine) if c is not None)
        gradient = None if culprits else self._first_nonfinite_gradient()
        self.stopped = NonFiniteStop(step=step, culprits=culprits, gradient=gradient)
        if self.ctx.is_main:
            self._record(self.stopped)
        if not self.loop_catches():
            self._say_at_exit()
        raise NonFiniteError(self.stopped)

    def _say_at_exit(self) -> None:
        """The stop's one line from rank 0, not a traceback per rank, where no started watched loop's hook
        (training.py, which also marks the run failed) says it: plain torchrun. Installed only now, at the
        stop, so a healthy run's excepthooks are never stacked (and unstacked) in an order that leaks one."""
        previous = sys.excepthook

        def excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
            if not issubclass(exc_type, NonFiniteError):
                previous(exc_type, exc, tb)
            elif self.ctx.is_main:
                print(str(exc), flush=True)

        sys.excepthook = excepthook
        self._hooked = (excepthook, previous)

    def _restore_excepthook(self) -> None:
        hooked, self._hooked = self._hooked, None
        if hooked is not None and sys.excepthook is hooked[0]:
            sys.excepthook = hooked[1]

    def _names(self, params: tuple[Any, ...]) -> list[str]:
        wanted = {id(p) for p in params}
        return [name for model in self._models for name, p in model.module.named_parameters() if id(p) in wanted]

    def _first_nonfinite_gradient(self) -> str | None:
        import torch

        for model in self._models:
            for name, p in model.module.named_parameters():
                if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                    return name
        return None

    def _record(self, stop: NonFiniteStop) -> None:
        if not self.run_dir:
            return
        path = Path(self.run_dir) / FILE.format(step=stop.step)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**stop.as_json(), "time": time.time()}, indent=1) + "\n")
            os.replace(tmp, path)
        except OSError as exc:  # the stop itself must still happen
            self.write(f"npudist: could not record the stop in {path}: {exc}")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def attach(rt: Any, model: Any) -> None:
    """npudist.ddp's part: the Runtime's sentinel (made and hooked on the first model, per its settings)
    watches ``model``."""
    settings = rt.settings
    if settings.sentinel == "off":
        return
    sentinel = getattr(rt, "sentinel", None)
    if sentinel is None:
        loop = getattr(rt, "loop", None)
        sentinel = Sentinel(rt.context, mode=settings.sentinel, spike_factor=settings.spike_factor,
                            skip_warn=settings.skip_warn, run_dir=settings.run_dir,
                            step_of=(lambda: loop.step if loop.started else None) if loop is not None else None)
        if loop is not None:
            sentinel.loop_catches = lambda: bool(loop.started)
        rt.sentinel = sentinel
        rt.own("telemetry", sentinel.install())
    sentinel.watch(model)


__all__ = ["NonFiniteError", "Sentinel", "attach"]
