"""The watched training loop: where each step ends, how long its batch took, and what rank 0 prints.

Any script gets this from ``npudist.init()`` under ``npudist launch --metrics-port``/``--run-dir`` (or
from ``npudist.loop(...)``): the end of a step comes from the optimizer's ``step`` (loop_hooks.py) or from
``npudist.step()``, a batch's arrival from the DataLoader iterator. The loop then drives the StepTimer
(step times, skew windows, straggler verdicts), the run log (RUN_DIR/metrics/rank{R}.jsonl), the loss and
throughput metrics, rank 0's progress line, and the end summary.

Step numbers are training steps: the step a resumed run starts after (``start_step``, or the optimizer's
own step count, which a loaded state_dict carries) plus the steps this process ran, in the timer, the run
log, the skew windows and the diagnosis files alike.

A step's line is printed when the next step begins (its first batch, ``data_wait``), when another step
ends, or at ``finish()``: a loop that logs its loss after ``optimizer.step()`` still has it on its line.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from npudist.telemetry.job.console import interrupted_line, progress, step_line
from npudist.telemetry.job.loop_parts import make_parts
from npudist.telemetry.job.loop_settings import (
    LINES_PER_RUN,
    MAX_NAME,
    MAX_NAMES,
    SETTING_NAMES,
    TIME_BETWEEN_LINES_S,
    LoopSettings,
    batch_size_of,
    flag_value,
    line_due,
    optimizer_step_count,
    total_hint,
)
from npudist.telemetry.job.loop_settings import scalar as _scalar

log = logging.getLogger("npudist.telemetry")


@dataclass(frozen=True)
class _Pending:
    step: int
    seconds: float | None
    now: float
    samples_per_second: float | None


class TrainingLoop:
    """One rank's watched loop. ``ctx`` is the DistContext; the telemetry, timer and run log are made from
    ``settings`` on ``start()`` by ``make_parts`` (injectable: tests pass fakes). ``write`` prints a line
    (rank 0 only calls it)."""

    def __init__(self, ctx: Any, settings: LoopSettings | None = None, *,
                 make_parts: Callable[[TrainingLoop], None] | None = None,
                 write: Callable[[str], None] | None = None, clock: Callable[[], float] = time.perf_counter,
                 argv: Sequence[str] | None = None) -> None:
        self.ctx = ctx
        self.settings = settings or LoopSettings()
        self.make_parts = make_parts
        self.write = write or _print
        self.clock = clock
        self.argv = list(sys.argv if argv is None else argv)
        self.telemetry: Any = None
        self.timer: Any = None
        self.drives_timer = True
        """False once the script made its own StepTimer on these metrics (``adopt``): it times the steps."""
        self.runlog: Any = None
        self.summary: Any = None
        self.tensorboard: Any = None
        """Rank 0's TensorBoard writer when asked for (tensorboard.py): the line's numbers, at its steps."""
        self.started = False
        self.step = self.settings.start_step or 0
        """The training step last ended (``start_step`` until one ends)."""
        self.start_step: int | None = self.settings.start_step
        self.total: int | None = self.settings.total_steps
        self.loader_length: int | None = None
        self.began: float | None = None
        """When this process's first step began (the progress line's elapsed time counts from here, once)."""
        self.failed = False
        self._lead: int | None = None
        self._explicit = False
        self._models: list[Any] = []
        self._scalars: dict[str, Any] = {}
        self._pending: _Pending | None = None
        self._last_end: float | None = None
        self._line_at: float | None = None
        self._window_samples = 0
        self._batch_samples: int | None = None
        self._first_begun = False
        self._hinted: int | None = -1
        self._runlog_opened = False
        self._finished = False
        self.closers: list[Callable[[], None]] = []
        """What ends this loop (hooks included), owned by the Runtime; owned again once the run log opens,
        so the last line is written before the run log closes (the latest closer of a kind runs first)."""

    # configuration ------------------------------------------------------------------------------------------
    def configure(self, **changes: Any) -> TrainingLoop:
        """Change settings (LoopSettings' fields); where the steps resume from only before the first ends."""
        unknown = sorted(set(changes) - SETTING_NAMES)
        if unknown:
            raise TypeError(f"npudist.loop: unknown setting(s) {', '.join(unknown)}; "
                            f"known: {', '.join(sorted(SETTING_NAMES))}")
        given = {k: v for k, v in changes.items() if v is not None or k in ("total_steps", "log_every")}
        if self._last_end is not None and "start_step" in given and given["start_step"] != self.start_step:
            raise ValueError("npudist.loop(start_step=...) after a step ended: configure it before the loop")
        self.settings = replace(self.settings, **given)
        if "start_step" in given:
            self.start_step = given["start_step"]
            self.step = given["start_step"]
            if self.timer is not None:
                self.timer.resume_at(self.step)
        if "total_steps" in given:
            self.total = given["total_steps"]
        return self

    def start(self) -> TrainingLoop:
        """Make the parts (metrics, timer, run log) once and start the first step's clock."""
        if self.started:
            return self
        self.started = True
        if self.make_parts is not None:
            self.make_parts(self)
        for model in self._models:
            self._watch(model)
        if not self._models:
            self._watch_collectives()
        if self.timer is not None:
            self.timer.step()  # starts the first step's clock
        self.began = self.clock()
        return self

    def watch_model(self, model: Any) -> None:
        """A model made by npudist.ddp: its gradient all-reduce wait is excluded from the skew windows."""
        self._models.append(model)
        if self.started:
            self._watch(model)

    def replace_telemetry(self, telemetry: Any) -> None:
        """The script asked for this rank's metrics with another device source: they replace the ones the
        loop started (same port), and the loop's timer records into them."""
        self.telemetry = telemetry
        if self.timer is not None and self.drives_timer:
            self.timer.metrics = telemetry.training
            self.timer.vitals, self.timer.rank_device = telemetry.vitals, telemetry.device
        telemetry.timer_made = self.adopt

    def adopt(self, timer: Any) -> None:
        """The script made its own StepTimer on this rank's metrics (``telemetry.step_timer()``): it times
        the steps from now on, so the loop stops driving its own (two timers would count every step twice
        and exchange twice); the summary and the run log follow the script's timer."""
        if timer is self.timer:
            return
        self.timer, self.drives_timer = timer, False
        if self.summary is not None:
            timer.on_exchange.append(self.summary)
        if self.runlog is not None:
            self.runlog.attach(timer)

    def _watch_collectives(self) -> None:
        """No model of npudist.ddp (FSDP2, tensor parallel, raw collectives): the time this rank had any
        collective in flight, from the process-group watch, is its wait. A synchronous job's fast ranks spend
        the straggler's extra time there and the straggler does not, so skew still compares work."""
        if self.timer is None or not self.drives_timer:
            return
        from npudist.comm import state as comm_state

        busy = comm_state.collective_seconds
        if busy() is not None:
            self.timer.count_waits(lambda: busy() or 0.0)

    def _watch(self, model: Any) -> None:
        if self.timer is None or not self.drives_timer:
            return
        from npudist.comm.ddp import gradient_sync

        syncs = [gradient_sync(m) for m in self._models]
        self.timer.count_waits(lambda: sum(s.wait_seconds for s in syncs))
        # The comm phases take the time backward's end blocked on its buckets: bucket time hidden behind
        # backward is compute, not communication (diagnosis/straggler/phases.py).
        self.timer.count_comm(lambda: sum(s.blocked_seconds for s in syncs))

    # events -------------------------------------------------------------------------------------------------
    def begin_step(self, at: float | None = None) -> None:
        """A step's first activity (its batch is asked for): prints the last step's line; before the first
        step ended, (re)starts the clock here, so setup is not the first step's time."""
        self.flush()
        if not self._first_begun and self._last_end is None and self.started:
            self._first_begun = True  # gradient accumulation: the step began at its first micro-batch
            now = self.clock() if at is None else at
            if self.timer is not None and self.drives_timer:
                self.timer.restart(now)
            self.began = now

    def fetched(self, batch: Any, seconds: float, at: float, loader_length: int | None = None) -> None:
        """A DataLoader iterator returned ``batch`` after ``seconds`` (asked at ``at``)."""
        self.begin_step(at)
        if self.timer is not None and self.drives_timer:
            self.timer.add_data_wait(seconds, at)
        if loader_length is not None and self.loader_length is None:
            self.loader_length = loader_length
        if self.settings.samples_per_step is None:
            self._batch_samples = batch_size_of(batch)

    @contextlib.contextmanager
    def data_wait(self) -> Iterator[None]:
        """``with loop.data_wait(): batch = ...``: for a loop without a DataLoader, the block's time is the
        step's data time, and the step begins there."""
        at = self.clock()
        self.begin_step(at)
        try:
            yield
        finally:
            if self.timer is not None and self.drives_timer:
                self.timer.add_data_wait(self.clock() - at, at)

    def optimizer_stepped(self, optimizer: Any) -> None:
        """The optimizer post-step hook: the first optimizer that steps marks the steps (a second one, a
        GAN's discriminator say, steps inside the same training step); ``npudist.step()`` overrides it."""
        if self._explicit:
            return
        if self._lead is None:
            self._lead = id(optimizer)
            if self.start_step is None:
                count = optimizer_step_count(optimizer)
                self._resume_from(count - 1 if count else 0)
        elif self._lead != id(optimizer):
            return
        self.end_step()

    def explicit_step(self) -> None:
        """``npudist.step()``: the script marks its steps itself; optimizer steps no longer count."""
        self._explicit = True
        self.end_step()

    def _resume_from(self, step: int) -> None:
        self.start_step = self.step = max(0, step)
        if self.timer is not None:
            self.timer.resume_at(self.step)

    def end_step(self) -> None:
        if not self.started:
            self.start()
        if self.start_step is None:
            self._resume_from(0)
        if not self._runlog_opened:
            self._runlog_opened = True
            if self.make_parts is not None and self._run_dir() is not None:
                self._open_run_log()
        self.flush()
        now_seconds = self.timer.step() if self.timer is not None and self.drives_timer else None
        now = self.clock()
        seconds = now_seconds if now_seconds is not None else (
            now - (self._last_end if self._last_end is not None else self.began or now))
        self._last_end = now
        self.step += 1
        per_step = self.settings.samples_per_step
        if per_step is None and self._batch_samples is not None:
            per_step = self._batch_samples * self.ctx.world_size
        self._window_samples += per_step or 0
        if self.total is None and self._hinted != self.loader_length:  # once, and again when a loader shows up
            self._hinted = self.loader_length
            self.total = total_hint(self.argv, self.loader_length)
        since = now - (self._line_at if self._line_at is not None else (self.began or now))
        if line_due(self.step, total=self.total, log_every=self.settings.log_every, since_line_s=since):
            window = now - (self._line_at if self._line_at is not None else (self.began or now))
            rate = self._window_samples / window if per_step and window > 0 else None
            self._pending = _Pending(self.step, seconds, now, rate)
            self._line_at, self._window_samples = now, 0

    def log(self, scalars: Mapping[str, Any]) -> None:
        """The script's own numbers (``loss`` goes on the progress line); tensors are read only when a line
        or record needs them, so logging every step costs no device sync."""
        for name, value in scalars.items():
            if not isinstance(name, str) or not name or len(name) > MAX_NAME:
                raise ValueError(f"npudist.log: name {name!r}; give a non-empty string of at most {MAX_NAME} "
                                 "characters")
            if name not in self._scalars and len(self._scalars) >= MAX_NAMES:
                raise ValueError(f"npudist.log: {name!r} would be name number {MAX_NAMES + 1}; log at most "
                                 f"{MAX_NAMES} names (a value per name, not a name per step)")
            self._scalars[name] = value

    # output -------------------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Print and record the last due step's line, if one is waiting."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        loss = _scalar(self._scalars["loss"]) if "loss" in self._scalars else None
        if self.runlog is not None:
            self.runlog.step(pending.step, loss, pending.seconds, pending.samples_per_second)
        if self.telemetry is not None:
            self.telemetry.training_progress(loss=loss, samples_per_second=pending.samples_per_second)
        values = {name: _scalar(v) for name, v in self._scalars.items() if name != "loss"}
        if self.tensorboard is not None:
            self.tensorboard.write(pending.step, {"loss": loss, "samples_per_second": pending.samples_per_second,
                                                  **values})
        if values:
            if self.runlog is not None:
                self.runlog.scalars(pending.step, values)
            progress_metrics = getattr(self.telemetry, "progress", None)
            if progress_metrics is not None:
                progress_metrics.report_scalars(values)
        if self.ctx.is_main:
            done = progress(pending.step, self.total, self.start_step or 0, self.began or pending.now, pending.now)
            where = (("world", str(self.ctx.world_size)), ("accelerator", self.ctx.accelerator.name),
                     ("backend", self.ctx.backend))
            self.write(step_line(pending.step, loss=loss, samples_per_second=pending.samples_per_second,
                                 done=done, where=where))

    def _run_dir(self) -> str | None:
        return self.settings.run_dir

    def _open_run_log(self) -> None:
        from npudist.telemetry.job.run_log import open_run_log

        self.runlog = open_run_log(self._run_dir(), self.ctx, self.telemetry, self.timer, self.start_step or 0,
                                   self.settings.resume_source)
        from npudist.runtime.state import current

        for close in self.closers:
            current().own("run_logs", close)

    def interrupted_line(self) -> str:
        """Ctrl-C's line: the step reached and the newest npudist checkpoint in the run directory."""
        run_dir = self._run_dir()
        steps: list[int] = []
        if run_dir is not None:
            from npudist import checkpoint

            steps = checkpoint.list_checkpoints(run_dir)
        last = f"step {max(steps)} in {run_dir}" if steps else None
        return interrupted_line(self.step, last, resumable=bool(steps))

    def summary_lines(self, *, checkpoints: bool | None = None) -> list[str]:
        """The end summary (RunSummary's lines) with the run directory's diagnoses and, when this run saved
        through npudist.checkpoint (``checkpoints`` None) or when asked, its checkpoints."""
        from npudist.telemetry.job.run_summary import RunSummary, checkpoint_lines

        summary = self.summary or RunSummary()
        run_dir = self._run_dir()
        if checkpoints is None and run_dir is not None:
            from npudist import checkpoint

            checkpoints = checkpoint.stats().snapshot.count > 0
        diagnosing = bool(self.settings.straggler_diagnosis)
        # The diagnoses line where they were asked for (or checkpoints shown, the example's summary): a
        # script that never asked gets no line about a flag it does not have.
        shown = run_dir if diagnosing or checkpoints else None
        return summary.lines(shown, checkpoint_lines(run_dir) if checkpoints and run_dir else None,
                             diagnosing=diagnosing)

    def finish(self, *, checkpoints: bool | None = None) -> None:
        """The last step's line, then (rank 0, once, after at least one step) the end summary."""
        self.flush()
        if self._finished or self.failed or self._last_end is None:
            return
        self._finished = True
        if self.ctx.is_main:
            self.write("\n".join(f"summary: {line}" for line in self.summary_lines(checkpoints=checkpoints)))

    def close(self) -> None:
        """finish() unless the run failed; the run log, metrics and hooks are closed by their owners."""
        try:
            self.finish()
        except Exception as exc:  # the summary is telemetry: never fail the teardown over it
            log.warning("no end summary: %s", exc)
        if self.tensorboard is not None:
            self.tensorboard.close()


def _print(line: str) -> None:
    print(line, flush=True)


__all__ = ["LINES_PER_RUN", "TIME_BETWEEN_LINES_S", "LoopSettings", "TrainingLoop", "batch_size_of", "flag_value",
           "line_due", "make_parts", "optimizer_step_count", "total_hint"]
