"""The run log writer: what `npudist report` reads, appended as JSON lines to RUN_DIR/metrics/rank{R}.jsonl.

The format (kinds, fields, units, version, path) is defined once in npudist.telemetry.runlog_schema, which the report
reads with; this module only builds records from training state and writes them. One file per rank, opened
in append mode so a resumed run adds a new ``start`` record and carries on in the same file.

Building a record is pure (the ``*_record`` functions); RunLog only adds the time and writes lines.
A write that fails is logged once and the run carries on: the log is telemetry, never a reason to stop.
"""

from __future__ import annotations

import json
import logging
import math
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from npudist.diagnosis.straggler.phases import PHASES, window_phases
from npudist.diagnosis.straggler.skew import SkewReport
from npudist.runtime.state import current
from npudist.telemetry import runlog_schema as schema
from npudist.telemetry.exposition.node_label import node_name
from npudist.telemetry.exposition.run_label import run_id
from npudist.telemetry.runlog_schema import rank_file
from npudist.telemetry.sources.readings import DeviceReading, RankDevice

log = logging.getLogger("npudist.telemetry")

__all__ = ["RunLog", "comm_record", "device_record", "open_run_log", "rank_file", "scalars_record", "skew_record",
           "step_record"]


def _number(value: float | None) -> float | None:
    """JSON has no NaN/inf: a non-finite reading is written as null (not recorded)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def step_record(step: int, loss: float | None, step_seconds: float | None,
                samples_per_second: float | None = None) -> dict[str, Any]:
    out = {"kind": "step", "step": int(step), "loss": _number(loss), "step_seconds": _number(step_seconds)}
    if samples_per_second is not None:
        out["samples_per_second"] = _number(samples_per_second)
    return out


def scalars_record(step: int, values: dict[str, float | None]) -> dict[str, Any]:
    """The script's own numbers at a logged step (npudist.log), non-finite ones as null."""
    return {"kind": "scalars", "step": int(step), "values": {k: _number(v) for k, v in values.items()}}


GIT_TIMEOUT_S = 5.0


def git_commit(path: str | Path) -> str | None:
    """The commit of the git checkout holding ``path`` (None when it is not one or git is missing)."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        done = subprocess.run([git, "-C", str(Path(path).resolve().parent), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def provenance(argv: list[str] | None = None) -> dict[str, str]:
    """What the report's summary card shows about how the run was started: command, versions, commit."""
    import torch

    from npudist._version import __version__

    argv = list(sys.argv if argv is None else argv)
    out = {"argv": shlex.join(argv)[: schema.MAX_TEXT], "npudist_version": __version__,
           "torch_version": str(torch.__version__)}
    commit = git_commit(argv[0]) if argv and argv[0] else None
    if commit:
        out["git_commit"] = commit
    return out


def skew_record(report: SkewReport) -> dict[str, Any]:
    return {"kind": "skew", "first_step": report.first_step, "last_step": report.last_step,
            "skew": _number(report.skew), "straggler": report.straggler,
            "means": [_number(m) for m in report.means], "flagged": [int(r) for r in report.flagged],
            "ratios": [_number(r) for r in report.ratios], **_phase_fields(report)}


def _phase_fields(report: SkewReport) -> dict[str, list[float | None]]:
    """``phase_<name>``: each rank's mean seconds per step in that phase over the window (null: a rank that
    sent no phases); absent when no rank did."""
    per_rank = window_phases(report)
    if all(p is None for p in per_rank):
        return {}
    return {f"phase_{name}": [None if p is None else _number(getattr(p, name)) for p in per_rank]
            for name in PHASES}


def device_record(reading: DeviceReading) -> dict[str, Any] | None:
    """The fields the report plots; None when the reading has none of them."""
    fields = {name: _number(getattr(reading, name)) for name in schema.DEVICE_FIELDS}
    if all(v is None for v in fields.values()):
        return None
    return {"kind": "device", "vendor": reading.vendor, "device_id": reading.device_id, **fields}


def comm_record(before: Any, after: Any, wall_seconds: float) -> dict[str, Any]:
    """Collective calls, bytes and seconds made between two ``npudist.comm.stats()`` snapshots."""
    start = {(s.op, s.backend): s for s in before.ops}
    ops = []
    for s in after.ops:
        b = start.get((s.op, s.backend))
        calls = s.calls - (b.calls if b else 0)
        if calls <= 0:
            continue
        ops.append({"op": s.op, "backend": s.backend, "calls": calls, "bytes": s.bytes - (b.bytes if b else 0),
                    "seconds": s.duration_sum_seconds - (b.duration_sum_seconds if b else 0.0)})
    return {"kind": "comm", "wall_seconds": _number(wall_seconds), "ops": ops}


def _comm_stats() -> Any:
    from npudist.comm import stats

    return stats()


class RunLog:
    """Appends one rank's records; ``attach(timer)`` adds the skew of every StepTimer exchange."""

    def __init__(self, path: str | Path, rank: int, *, readings: Callable[[], DeviceReading | None] | None = None,
                 comm_stats: Callable[[], Any] | None = _comm_stats, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.perf_counter) -> None:
        self.path, self.rank = Path(path), rank
        self.readings, self.comm_stats, self.clock, self.monotonic = readings, comm_stats, clock, monotonic
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")
        self._failed = False
        self._last_device: dict[str, Any] | None = None
        self._opened = monotonic()
        self._comm_before = comm_stats() if comm_stats is not None else None

    def write(self, record: dict[str, Any]) -> None:
        """One JSON line with the time and rank added; flushed so a killed run keeps what it wrote."""
        if self._file is None:
            return
        line = json.dumps({"v": schema.VERSION, "time": self.clock(), "rank": self.rank, **record}, allow_nan=False)
        try:
            self._file.write(line + "\n")
            self._file.flush()
        except (OSError, ValueError) as exc:  # disk full, file closed under us
            if not self._failed:
                log.warning("run log %s: write failed, further records are dropped: %s", self.path, exc)
            self._failed = True

    def start(self, *, world: int, accelerator: str, backend: str, start_step: int,
              device: RankDevice | None = None, resume_source: str | None = None) -> None:
        """The segment's first record; ``device`` is the physical card and chip this rank computes on."""
        where = {} if device is None else {"npu_id": device.device_id, "chip_id": device.chip_id}
        about = provenance() if self.rank == 0 else {}  # one rank is enough for the report's card
        if resume_source is not None:
            about["resume_source"] = resume_source
        run = {"run": label} if (label := run_id()) else {}  # the metrics' run label (run_label.py)
        self.write({"kind": "start", "world": world, "node": node_name(), "accelerator": accelerator,
                    "backend": backend, "start_step": start_step, **run, **where, **about})

    def step(self, step: int, loss: float | None, step_seconds: float | None,
             samples_per_second: float | None = None) -> None:
        """A logged step, plus this rank's device reading when a device source has a new one (the poller
        reads every 15 s, so most steps see the reading already written)."""
        self.write(step_record(step, loss, step_seconds, samples_per_second))
        reading = self.readings() if self.readings is not None else None
        record = device_record(reading) if reading is not None else None
        if record is not None and record != self._last_device:
            self._last_device = record
            self.write(record)

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        self.write(scalars_record(step, values))

    def skew(self, report: SkewReport) -> None:
        self.write(skew_record(report))

    def attach(self, timer: Any) -> None:
        """Record every skew exchange of ``timer`` (a StepTimer)."""
        timer.on_exchange.append(self.skew)

    def close(self) -> None:
        """Write the collective totals of this run segment and close the file."""
        if self._file is None:
            return
        if self.comm_stats is not None and self._comm_before is not None:
            try:
                self.write(comm_record(self._comm_before, self.comm_stats(), self.monotonic() - self._opened))
            except Exception as exc:  # telemetry: report and carry on
                log.warning("run log %s: no collective totals: %s", self.path, exc)
        self._file.close()
        self._file = None


def open_run_log(run_dir: str | Path, ctx: Any, telemetry: Any = None, timer: Any = None,
                 start_step: int = 0, resume_source: str | None = None) -> RunLog:
    """A RunLog for this rank (``ctx`` from npudist.init()), reading device values from ``telemetry``'s
    poller when it has one and recording ``timer``'s skew exchanges. Owned by the Runtime: ``npudist.shutdown()``
    closes it if the script did not."""
    readings = None
    if telemetry is not None and telemetry.poller is not None:
        from npudist.telemetry.exposition.rank_exporter import local_reading

        poller, local_rank, device = telemetry.poller, ctx.local_rank, telemetry.device

        def readings() -> DeviceReading | None:
            return local_reading(poller.snapshot().readings, local_rank, device)

    runlog = RunLog(rank_file(run_dir, ctx.rank), ctx.rank, readings=readings)
    current().own("run_logs", runlog.close)  # shutdown() writes its totals and closes it, at the latest
    runlog.start(world=ctx.world_size, accelerator=ctx.accelerator.name, backend=ctx.backend,
                 start_step=start_step, device=telemetry.device if telemetry is not None else None,
                 resume_source=resume_source)
    if timer is not None:
        runlog.attach(timer)
    return runlog
