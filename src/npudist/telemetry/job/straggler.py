"""Straggler action: when the skew alert condition holds for N windows in a row, write a diagnosis.

The alert (rules in npudist.dashboards) fires when skew stays above the catalogue's ``skew`` threshold
for its duration; in the job the same condition is counted in exchange windows, so the diagnosis lands
next to the checkpoints while the slow card is still slow: which rank, its recent window mean step
times, its device's temperature, frequency and utilization as the collectors last read them, and the
physical card (npu-smi NPU ID and chip) that rank computes on.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

from npudist.telemetry.job.skew import DEFAULT_THRESHOLD, SkewReport

log = logging.getLogger("npudist.telemetry")


def diagnosis(history: list[SkewReport], threshold: float) -> dict[str, Any]:
    """The JSON document for a streak of skewed windows (oldest first); pure, for tests."""
    last = history[-1]
    slow = last.straggler
    mean_all = sum(last.means) / len(last.means)

    def at(values: tuple, rank: int) -> Any:
        return values[rank] if rank < len(values) else None

    return {
        "straggler_rank": slow,
        "threshold": threshold,
        "windows": len(history),
        "steps": [history[0].first_step, last.last_step],
        "skew": [r.skew for r in history],
        "straggler_step_seconds": [r.means[slow] for r in history],
        "mean_step_seconds_all_ranks": mean_all,
        "slowdown_ratio": last.means[slow] / mean_all if mean_all > 0 else None,
        "device": {**_physical(at(last.devices, slow)),
                   "temperature_celsius": at(last.temperatures, slow), "frequency_hertz": at(last.frequencies, slow),
                   "utilization_ratio": at(last.utilizations, slow)},
        "all_ranks_step_seconds": list(last.means),
        "time": time.time(),
    }


def _physical(device: tuple[int, int] | None) -> dict[str, int | None]:
    """The straggler's card as npu-smi names it (NPU ID, chip); None when its rank could not tell."""
    npu_id, chip_id = device if device is not None else (None, None)
    return {"npu_id": npu_id, "chip_id": chip_id}


class StragglerDiagnosis:
    """Append to StepTimer.on_exchange on one rank: counts skewed windows, writes RUN_DIR/straggler-step<N>.json once
    per streak of ``windows`` consecutive windows above ``threshold``."""

    def __init__(self, run_dir: str | os.PathLike, windows: int = 3, threshold: float = DEFAULT_THRESHOLD) -> None:
        if windows < 1:
            raise ValueError(f"windows must be >= 1, got {windows}")
        self.run_dir, self.windows, self.threshold = Path(run_dir), windows, threshold
        self._streak: deque[SkewReport] = deque(maxlen=windows)
        self._written = False
        self.written: list[Path] = []

    def __call__(self, report: SkewReport) -> Path | None:
        if report.skew <= self.threshold:
            self._streak.clear()
            self._written = False
            return None
        self._streak.append(report)
        if len(self._streak) < self.windows or self._written:
            return None
        doc = diagnosis(list(self._streak), self.threshold)
        path = self.run_dir / f"straggler-step{report.last_step:08d}.json"
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("could not write the straggler diagnosis to %s: %s", path, exc)
            return None
        self._written = True
        self.written.append(path)
        log.warning("straggler diagnosis: rank %d slow for %d windows; wrote %s", doc["straggler_rank"],
                    self.windows, path)
        return path
