"""A hand-written run directory: two ranks, one resume, one skew window, comm totals, a bench result."""

from __future__ import annotations

import json
from pathlib import Path

RANK0 = [
    {"v": 1, "time": 1000.0, "kind": "start", "world": 2, "node": "n1", "accelerator": "cpu", "backend": "gloo",
     "start_step": 0},
    {"v": 1, "time": 1001.0, "kind": "step", "step": 1, "loss": 4.0, "step_seconds": 0.5},
    {"v": 1, "time": 1002.0, "kind": "device", "utilization_ratio": 0.25, "power_watts": 80.0,
     "temperature_celsius": None, "memory_used_bytes": 2147483648},
    {"v": 1, "time": 1010.0, "kind": "step", "step": 10, "loss": 2.0, "step_seconds": 0.25},
    {"v": 1, "time": 1011.0, "kind": "skew", "first_step": 1, "last_step": 10, "skew": 0.2, "straggler": 1,
     "means": [0.4, 0.6]},
    {"v": 1, "time": 1012.0, "kind": "comm", "wall_seconds": 12.0,
     "ops": [{"op": "all_reduce", "backend": "gloo", "calls": 10, "bytes": 4000, "seconds": 3.0}]},
    # resumed from the checkpoint at step 10: step 10 runs again and its later record wins
    {"v": 1, "time": 2000.0, "kind": "start", "world": 2, "node": "n1", "accelerator": "cpu", "backend": "gloo",
     "start_step": 10},
    {"v": 1, "time": 2001.0, "kind": "step", "step": 10, "loss": 1.5, "step_seconds": 0.2},
    {"v": 1, "time": 2002.0, "kind": "step", "step": 20, "loss": 1.0, "step_seconds": 0.2},
    {"v": 1, "time": 2003.0, "kind": "comm", "wall_seconds": 4.0,
     "ops": [{"op": "all_reduce", "backend": "gloo", "calls": 5, "bytes": 2000, "seconds": 1.0}]},
]
RANK1 = [
    {"v": 1, "time": 1000.5, "kind": "start", "world": 2, "node": "n1", "accelerator": "cpu", "backend": "gloo",
     "start_step": 0},
    {"v": 1, "time": 1001.0, "kind": "step", "step": 1, "loss": 4.5, "step_seconds": 0.7},
    {"v": 1, "time": 1011.0, "kind": "skew", "first_step": 1, "last_step": 10, "skew": 0.2, "straggler": 1,
     "means": [0.4, 0.6]},
]
BENCH = {"meta": {"op": "all_reduce", "world": 2, "backend": "gloo", "dtype": "float32"},
         "rows": [{"size_bytes": 1024, "busbw_gbps": 0.5}, {"size_bytes": 4096, "busbw_gbps": 2.0}]}


def write_run(root: Path, *, bad_lines: bool = False) -> Path:
    (root / "metrics").mkdir(parents=True)
    (root / "bench").mkdir()
    lines0 = [json.dumps(r) for r in RANK0]
    if bad_lines:
        lines0.insert(2, '{"v": 1, "time": 1001.5, "kind": "st')  # a run killed mid-write
        lines0.insert(3, '{"v": 1, "time": 1001.6, "kind": "weather"}')
    (root / "metrics" / "rank0.jsonl").write_text("\n".join(lines0) + "\n")
    (root / "metrics" / "rank1.jsonl").write_text("\n".join(json.dumps(r) for r in RANK1) + "\n")
    (root / "bench" / "all_reduce.json").write_text(json.dumps(BENCH))
    return root
