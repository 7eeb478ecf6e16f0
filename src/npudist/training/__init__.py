"""The user's own loop, watched: ``npudist.loop()``, ``npudist.step()``, ``npudist.log()``, ``npudist.ddp()``.

``npudist.init()`` gives the Runtime a TrainingLoop (telemetry/job/loop.py) and starts it when the launch
asked for metrics or a run directory (NPUDIST_METRICS_PORT, NPUDIST_RUN_DIR: ``npudist launch
--metrics-port P --run-dir DIR``) or when ``init(watch=True)``; ``npudist.loop(...)`` configures and starts
it from the script. Started, it hooks the optimizer's step and the DataLoader (loop_hooks.py), serves the
rank metrics, writes the run log and prints rank 0's progress line, the end summary and the Ctrl-C line.
Everything it starts is the Runtime's: ``npudist.shutdown()`` (or the exit hook) removes the hooks and
closes the rest.

This module sits beside lifecycle.py, above comm and telemetry, and imports telemetry only once a loop is
made, so ``import npudist`` stays light.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from npudist.runtime.state import current, peek


def _loop_of(rt: Any, what: str) -> Any:
    loop = getattr(rt, "loop", None) if rt is not None else None
    if loop is None:
        raise RuntimeError(f"npudist.{what} needs npudist.init() first (start the job with `npudist launch`)")
    return loop


def attach(rt: Any, ctx: Any, watch: bool | None) -> Any:
    """init()'s part: give ``rt`` its TrainingLoop, started when ``watch`` says so (None: when the launch
    asked for metrics or a run directory)."""
    from npudist.telemetry.job.loop import LoopSettings, TrainingLoop, make_parts

    if getattr(rt, "loop", None) is None:
        rt.loop = TrainingLoop(ctx, LoopSettings(run_dir=rt.settings.run_dir, tensorboard=rt.settings.tensorboard),
                               make_parts=make_parts)
    if watch is None:
        watch = rt.settings.metrics_port is not None or rt.settings.run_dir is not None
    if watch:
        _start(rt, rt.loop)
    return rt.loop


def _start(rt: Any, loop: Any) -> None:
    if loop.started:
        return
    from npudist.telemetry.job import loop_hooks

    loop.start()
    uninstall = loop_hooks.install(loop)
    restore = _watch_exit(loop)

    def close() -> None:
        try:
            loop.close()
        finally:
            uninstall()
            restore()

    rt.own("run_logs", close)
    loop.closers.append(close)


def loop(**settings: Any) -> Any:
    """Configure and start this rank's watched loop; returns it (a TrainingLoop).

    Keywords are LoopSettings' fields: ``total_steps`` (the ETA's target), ``start_step`` (the step a
    resumed run starts after), ``log_every``, ``samples_per_step``, ``run_dir`` (the run log's directory),
    ``exchange_every``, ``op_every``, ``op_ranks``, ``straggler_diagnosis``, ``telemetry``,
    ``resume_source`` and ``tensorboard`` (rank 0's TensorBoard event files). Call it after init() and
    before the first step; calling it again changes the settings (start_step only before a step ended).
    A ``run_dir`` is also where the hang watchdog writes its reports (as NPUDIST_RUN_DIR is).
    """
    rt = current()
    the_loop = _loop_of(rt, "loop()")
    if the_loop.started and {"telemetry", "exchange_every", "op_every", "op_ranks", "tensorboard"} & set(settings):
        raise ValueError(f"npudist.loop: {', '.join(sorted(settings))} must be given before the loop starts: "
                         "pass init(watch=False) and call npudist.loop(...) once with them")
    the_loop.configure(**settings)
    if settings.get("run_dir"):
        from npudist.comm import set_run_dir

        set_run_dir(settings["run_dir"])
    _start(rt, the_loop)
    return the_loop


def step() -> None:
    """End one training step where no optimizer marks it (a loop with a hand-written update, evaluation
    steps); once called, optimizer steps no longer count. A no-op before init()."""
    loop = getattr(peek(), "loop", None)
    if loop is not None:
        _start(current(), loop)
        loop.explicit_step()


def log(scalars: dict[str, Any] | None = None, /, **values: Any) -> None:
    """Record the script's own numbers: ``npudist.log({"loss": loss, "lr": lr})``; ``loss`` is shown on the
    progress line and exported as npudist_training_loss. Tensors are read only when a line or record needs
    them. A no-op before init()."""
    loop = getattr(peek(), "loop", None)
    if loop is not None:
        loop.log({**(scalars or {}), **values})


def ddp(model: Any, **ddp_kwargs: Any) -> Any:
    """``npudist.comm.ddp.ddp`` (the model on this rank's device in DistributedDataParallel, its gradients
    reduced by npudist), also telling the watched loop, so its wait in gradient all-reduce is excluded from
    the skew windows, and the NaN sentinel (npudist/training/sentinel.py), so a non-finite loss on any rank stops
    every rank before that step's update."""
    from npudist.comm.ddp import ddp as make_ddp

    wrapped = make_ddp(model, **ddp_kwargs)
    rt = peek()
    loop = getattr(rt, "loop", None)
    if loop is not None:
        loop.watch_model(wrapped)
    from npudist.training import sentinel

    sentinel.attach(rt, wrapped)  # NaN/Inf and loss spikes (NPUDIST_SENTINEL=off: nothing)
    return wrapped


def _watch_exit(loop: Any) -> Any:
    """Ctrl-C's one line on rank 0 (instead of a traceback on every rank), and no end summary after a
    failure: a SIGINT handler (only where the script kept Python's default) and an excepthook, both given
    back at close."""
    from npudist.telemetry.job.console import Interrupt
    from npudist.training.sentinel import NonFiniteError

    interrupt = None
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        interrupt = Interrupt()
    previous = sys.excepthook

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        loop.failed = True
        if issubclass(exc_type, NonFiniteError):  # every rank stops in the same step: one line, no tracebacks
            if loop.ctx.is_main:
                print(str(exc), flush=True)
            return
        interrupted = interrupt.caused(exc) if interrupt is not None else issubclass(exc_type, KeyboardInterrupt)
        if not interrupted:
            previous(exc_type, exc, tb)
            return
        if loop.ctx.is_main:
            print(loop.interrupted_line(), flush=True)

    sys.excepthook = excepthook

    def restore() -> None:
        if sys.excepthook is excepthook:
            sys.excepthook = previous
        if interrupt is not None:
            interrupt.restore()

    return restore
