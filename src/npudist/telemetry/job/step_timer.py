"""Training-loop metrics: StepTimer records step times, exchanges window means, samples operator times."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from prometheus_client.core import Metric

from npudist.diagnosis.straggler.detector import StragglerDetector
from npudist.diagnosis.straggler.phases import PHASES, StepPhases, split_step, transfer_estimate
from npudist.diagnosis.straggler.skew import SkewReport, skew_report
from npudist.telemetry.exposition.catalogue import family, rank_label_values
from npudist.telemetry.job import op_sampling
from npudist.telemetry.job.histogram import OP_BUCKETS, STEP_BUCKETS, Histogram
from npudist.telemetry.job.straggler import PhaseWarnings, StragglerWarnings
from npudist.telemetry.sources.readings import RankDevice

log = logging.getLogger("npudist.telemetry")

Vitals = Callable[[], tuple[float | None, ...]]
"""(temperature_c, frequency_hz[, utilization_ratio]) of this rank's device; None = unknown."""
"""Returns this rank's device (temperature_celsius, frequency_hertz), None where unknown."""


class TrainingMetrics:
    """What StepTimer records, exported with this rank's label values (catalogue.RANK_LABELS order)."""

    def __init__(self, rank_labels: Sequence[str] = ("0", "0", "", "", "", "")) -> None:
        self.labels = rank_label_values(rank_labels)
        self.steps = Histogram(STEP_BUCKETS)
        self._ops: dict[str, Histogram] = {}
        self._lock = threading.Lock()
        self.skew: SkewReport | None = None
        self.rank: int | None = None
        """This process's rank in the exchange (set at the first one)."""
        self.phases = dict.fromkeys(PHASES, 0.0)
        """Seconds of the steps so far in each phase (npudist_rank_phase_seconds_total)."""

    def observe_phases(self, phases: StepPhases) -> None:
        with self._lock:
            for name, seconds in phases.items():
                self.phases[name] += seconds

    def observe_op(self, op: str, seconds: float) -> None:
        with self._lock:
            hist = self._ops.get(op)
            if hist is None:
                hist = self._ops[op] = Histogram(OP_BUCKETS)
        hist.observe(seconds)

    def collect(self) -> Iterator[Metric]:
        buckets, total, count = self.steps.buckets()
        fam = family("npudist_step_duration_seconds")
        fam.add_metric(self.labels, buckets, total)
        yield fam
        fam = family("npudist_steps_total")
        fam.add_metric(self.labels, count)
        yield fam
        fam = family("npudist_rank_phase_seconds_total")
        with self._lock:
            phases = list(self.phases.items())
        for name, seconds in phases:
            fam.add_metric([*self.labels, name], seconds)
        yield fam
        yield from self._straggler_families(self.skew, self.rank)
        fam = family("npudist_op_duration_seconds")
        with self._lock:
            ops = sorted(self._ops.items())
        for op, hist in ops:
            b, s, _ = hist.buckets()
            fam.add_metric([*self.labels, op], b, s)
        yield fam


    def _straggler_families(self, report: SkewReport | None, rank: int | None) -> Iterator[Metric]:
        """Every rank: its own slowdown ratio and flag (O(1) series per rank). Rank 0: the job's skew and the
        flagged rank with the largest slowdown (absent while no rank is flagged)."""
        skew, straggler = family("npudist_step_skew_ratio"), family("npudist_straggler_rank")
        ratio, flagged = family("npudist_rank_slowdown_ratio"), family("npudist_rank_straggler")
        if report is not None and rank is not None:
            mine = report.ratios[rank] if rank < len(report.ratios) else None
            if mine is not None and math.isfinite(mine):
                ratio.add_metric(self.labels, mine)
            flagged.add_metric(self.labels, 1.0 if rank in report.flagged else 0.0)
            if rank == 0:
                skew.add_metric(self.labels, report.skew)
                if report.flagged:
                    worst = max(report.flagged, key=lambda r: (report.ratios[r] or 0.0, -r))
                    straggler.add_metric(self.labels, worst)
        yield from (skew, straggler, ratio, flagged)


class StepTimer:
    """Times training steps, as ``with timer:`` around a step or ``timer.step()`` at the end of each.

    Every ``exchange_every`` steps all ranks all_gather their window mean work time with their device's
    vitals, physical ids and section times (one tensor of 8 floats, so every rank must use the same
    setting). Every rank feeds the rows to its own StragglerDetector (same rows, same verdict, so each rank
    exports its own flag without another message); rank 0 logs one line when a rank becomes a straggler and
    one when it recovers. Every ``op_every`` steps (0 = never) one step runs under torch.profiler and its
    operator self times feed npudist_op_duration_seconds, on every rank or, with ``op_ranks`` = k > 0, on
    about k ranks spread over the job (op_sampling.samples_ops). ``straggler_settings`` go to
    StragglerDetector.
    """

    def __init__(self, metrics: TrainingMetrics | None = None, *, exchange_every: int = 20,
                 straggler_settings: Mapping[str, Any] | None = None, op_every: int = 0, op_ranks: int = 0,
                 group: Any = None,
                 vitals: Vitals | None = None, synchronize: Callable[[], None] | None = None,
                 device_type: str = "cpu", rank_device: RankDevice | None = None,
                 clock: Callable[[], float] = time.perf_counter, start_step: int = 0) -> None:
        if exchange_every < 0 or op_every < 0:
            raise ValueError("exchange_every and op_every must be >= 0 (0 turns the feature off)")
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0 (the training step a resumed run starts after), got "
                             f"{start_step}")
        self.straggler_settings = dict(straggler_settings or {})
        StragglerDetector(2, **self.straggler_settings)  # refuse bad settings now, not at the first exchange
        self.detector: StragglerDetector | None = None
        self.warnings = StragglerWarnings()
        self.phase_warnings = PhaseWarnings()
        self.metrics = metrics or TrainingMetrics()
        self.exchange_every, self.op_every = exchange_every, op_every
        self.group = group
        rank, world = _rank_and_world(group)
        if not op_sampling.samples_ops(rank, world, op_ranks):
            self.op_every = 0  # op_ranks: only a spread-out subset of ranks profiles operators
        self.vitals, self.synchronize, self.device_type, self.clock = vitals, synchronize, device_type, clock
        self.rank_device = rank_device
        """This rank's physical device, exchanged so the straggler is named by its card and chip."""
        self.steps_done = start_step
        """The training step last ended: ``start_step`` (the step a resumed run starts after) plus the steps
        timed, so windows, reports and diagnosis files name training steps, continuous across resumes."""
        self._window: list[float] = []
        self._window_data = self._window_comm = self._window_other = self._window_compute = 0.0
        self._waited = 0.0
        self._data_waited = 0.0
        self._wait_total: Callable[[], float] | None = None
        self._wait_seen = 0.0
        self._comm_total: Callable[[], float] | None = None
        self._comm_seen = 0.0
        self._begun_at: float | None = None
        """When this step asked for its first batch (the end of its ``other`` phase)."""
        self.transfer_s: float | None = None
        """The job's communication transfer time per step, from the last exchange (phases.transfer_estimate);
        None before the first: a step's blocked time then counts as transfer."""
        self._started: float | None = None
        self._prof: Any = None
        self.last_report: SkewReport | None = None
        self.on_exchange: list[Callable[[SkewReport], None]] = []
        """Called on every rank with each exchange's report (run log, straggler diagnosis); errors are logged."""

    # context-manager form: the block is one step
    def __enter__(self) -> StepTimer:
        self._maybe_start_profiler(self.steps_done + 1)
        self._start_clock()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self._end_step()
        else:
            self._stop_profiler(feed=False)
        self._started = None

    def step(self) -> float | None:
        """Mark the end of a step (the first call only starts the clock); returns the step's seconds."""
        if self._started is None:
            self._start_clock()
            self._maybe_start_profiler(self.steps_done + 1)
            return None
        seconds = self._end_step()
        self._maybe_start_profiler(self.steps_done + 1)
        self._started = self.clock()
        return seconds

    def resume_at(self, step: int) -> None:
        """Number the next step ``step + 1`` (a loop that learns its resumed step after the timer was made);
        only before the first step ended, so a window never spans two numberings."""
        if self._window or step < 0:
            raise ValueError(f"resume_at({step}): only a step >= 0, before the first step of a window ended")
        self.steps_done = step

    def restart(self, at: float | None = None) -> None:
        """(Re)start the current step's clock at ``at`` (default now), dropping what it had counted: the
        first step of a loop that is found to begin later than the timer was made."""
        self.pause()
        self._maybe_start_profiler(self.steps_done + 1)
        self._start_clock()
        if at is not None:
            self._started = at

    def _start_clock(self) -> None:
        self._started = self.clock()
        if self._wait_total is not None:  # waits before the step began are not the step's
            self._wait_seen = self._wait_total()
        if self._comm_total is not None:
            self._comm_seen = self._comm_total()
        self._begun_at = None

    def pause(self) -> None:
        """Stop the clock without recording a step (evaluation, checkpointing, a data reload).

        The next ``step()`` starts the clock again, like the first call; a half-run profiled step is
        dropped, not fed into the operator histogram.
        """
        self._stop_profiler(feed=False)
        self._started = None
        self._waited = self._data_waited = 0.0
        self._begun_at = None

    def _end_step(self) -> float:
        if self.synchronize is not None:
            self.synchronize()  # device work is asynchronous: wait for it, or the step time is launch time
        seconds = self.clock() - (self._started or 0.0)
        if self._wait_total is not None:
            total = self._wait_total()
            self._waited += total - self._wait_seen
            self._wait_seen = total
        blocked = self._waited
        if self._comm_total is not None:
            total = self._comm_total()
            blocked, self._comm_seen = total - self._comm_seen, total
        other = self._begun_at - self._started if self._begun_at is not None and self._started is not None \
            else 0.0
        phases = split_step(step_s=seconds, data_s=self._data_waited, comm_s=blocked, other_s=other,
                            transfer_s=self.transfer_s)
        self._stop_profiler(feed=True)
        self.steps_done += 1
        self.metrics.steps.observe(seconds)
        self.metrics.observe_phases(phases)
        # Skew compares the time each rank spent *working*: in synchronous data parallelism the fast
        # ranks spend the difference waiting in collectives, so their wall step times equal the slow one's.
        self._window.append(max(0.0, seconds - self._waited))
        self._window_comm += phases.comm
        self._window_data += phases.data
        self._window_other += phases.other
        self._window_compute += phases.compute
        self._waited = self._data_waited = 0.0
        self._begun_at = None
        if self.exchange_every and self.steps_done % self.exchange_every == 0:
            self._exchange()
        return seconds

    def add_wait(self, seconds: float) -> None:
        """Time this step spent blocked in a collective; excluded from skew, not from
        npudist_step_duration_seconds."""
        self._waited += seconds

    def add_data_wait(self, seconds: float, at: float | None = None) -> None:
        """Time this step waited for its input before the forward (loader, host-to-device copy): part of the
        rank's work, reported apart so a straggler's cause can say "data". ``at``: when the wait began (the
        step's first one ends its ``other`` phase)."""
        self._data_waited += seconds
        if at is not None and self._begun_at is None:
            self._begun_at = at

    @contextmanager
    def data_wait(self) -> Iterator[None]:
        """``with timer.data_wait(): batch = next(loader)``: the block's time counts as data wait."""
        start = self.clock()
        try:
            yield
        finally:
            self.add_data_wait(self.clock() - start, start)

    def count_waits(self, total: Callable[[], float]) -> None:
        """Read ``total()``, a cumulative count of seconds spent waiting in collectives, at the end of each
        step: its increase over the step counts as waiting (see watch_ddp)."""
        self._wait_total = total
        self._wait_seen = total()

    def count_comm(self, total: Callable[[], float]) -> None:
        """Read ``total()``, cumulative seconds this rank was *blocked* on communication, at the end of each
        step for its comm phases (default: the waits of count_waits): npudist.ddp's end-of-backward wait,
        which excludes bucket time hidden behind backward, or the process-group watch's busy time."""
        self._comm_total = total
        self._comm_seen = total()

    def _maybe_start_profiler(self, next_step: int) -> None:
        if self.op_every and next_step % self.op_every == 0 and self._prof is None:
            try:
                self._prof = op_sampling.start_op_timer(self.device_type)
            except Exception as exc:  # the profiler is optional telemetry: never break training over it
                log.warning("operator timing disabled: torch.profiler failed to start: %s", exc)
                self.op_every = 0

    def _stop_profiler(self, feed: bool) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        try:
            prof.__exit__(None, None, None)
            if feed:
                for op, seconds in op_sampling.profiled_op_durations(prof, self.device_type):
                    self.metrics.observe_op(op, seconds)
        except Exception as exc:
            log.warning("operator timing for step %d failed: %s", self.steps_done + 1, exc)

    def _exchange(self) -> None:
        window, self._window = self._window, []
        mean = sum(window) / len(window)
        data, comm = self._window_data / len(window), self._window_comm / len(window)
        other, compute = self._window_other / len(window), self._window_compute / len(window)
        self._window_data = self._window_comm = self._window_other = self._window_compute = 0.0
        vitals = tuple(self.vitals()) if self.vitals is not None else ()
        vitals += (None,) * (3 - len(vitals))
        where = (math.nan, math.nan) if self.rank_device is None else \
            (float(self.rank_device.device_id), float(self.rank_device.chip_id))  # float32-exact below 2**24
        row = [mean, *(math.nan if v is None else float(v) for v in vitals[:3]), *where, data, comm, other,
               compute]
        rows, rank = _all_gather_rows(row, self.group)
        first = self.steps_done - len(window) + 1
        report = self._judge(skew_report(first, self.steps_done, rows))
        self.last_report = report
        self.transfer_s = transfer_estimate(report.comm_waits)
        for hook in self.on_exchange:
            try:
                hook(report)
            except Exception as exc:  # a recorder must never stop training
                log.warning("skew hook failed after step %d: %s", self.steps_done, exc)
        self.metrics.rank, self.metrics.skew = rank, report
        if rank == 0:
            self.warnings(report)
            self.phase_warnings(report)

    def _judge(self, report: SkewReport) -> SkewReport:
        n = len(report.means)
        if self.detector is None or self.detector.world_size != n:
            self.detector = StragglerDetector(n, **self.straggler_settings)
        flagged = self.detector.update(report.means)
        ratios = tuple(float(r) if math.isfinite(r) else None for r in self.detector.ratios)
        return replace(report, ratios=ratios, flagged=tuple(flagged))


def _rank_and_world(group: Any) -> tuple[int, int]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _all_gather_rows(row: list[float], group: Any) -> tuple[list[list[float]], int]:
    """Every rank's row, by rank, with one small all_gather on the group's device (npudist.comm.control);
    this process alone when there is no group."""
    from npudist.comm import control

    return control.gather_rows(row, group)


def watch_ddp(ddp: Any, timer: StepTimer) -> None:
    """Count the time a model made by ``npudist.ddp`` spends in gradient all-reduce as waiting in ``timer``,
    so skew compares the ranks' work and finds the slow one.

    Read-only: npudist.comm's DDP hook sums each bucket's issue-to-completion time (long on the ranks
    that wait for a straggler, short on the straggler itself) and the timer reads the sum at each step.
    """
    from npudist.comm.ddp import gradient_sync

    sync = gradient_sync(ddp)
    timer.count_waits(lambda: sync.wait_seconds)
    timer.count_comm(lambda: sync.blocked_seconds)  # the comm phases: only what backward's end waited for
