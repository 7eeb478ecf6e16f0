"""Telemetry overhead on the example job: interleaved runs with and without telemetry, medians.

    python benchmarks/telemetry_overhead.py [--pairs 5] [--steps 200] [--nproc 2]

"On" = StepTimer, skew exchange every 20 steps, operator sampling every 100 steps, rank exporters on
NPUDIST_METRICS_PORT + local rank, each scraped every second by a scraper thread here. "Off" =
`--no-telemetry`. Per run, the time per step is the training time the example reports (its
samples/s windows after step 1, so process start-up and the first step are excluded) over the steps.
Target: median(on) / median(off) - 1 <= 2 %.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WINDOW = re.compile(r"step=(\d+) loss=\S+ samples/s=([\d.]+)")


def _free_base(n: int) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n < 65536:
            return base


def _scraper(base: int, n: int, stop: threading.Event, counts: list[int]) -> None:
    while not stop.wait(1.0):
        for i in range(n):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{base + i}/metrics", timeout=2).read()
                counts[0] += 1
            except OSError:
                pass


def run_once(telemetry: bool, steps: int, nproc: int, batch: int) -> tuple[float, int]:
    """(seconds per step, scrapes served) for one run of examples/train_ddp.py."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPUDIST_")}
    env["PYTHONPATH"] = str(REPO / "src")
    env.setdefault("OMP_NUM_THREADS", "1")
    args = [sys.executable, "-m", "npudist", "launch", "--nproc-per-node", str(nproc)]
    base = _free_base(nproc)
    if telemetry:
        args += ["--metrics-port", str(base)]
    log_every = 20
    args += [str(REPO / "examples" / "train_ddp.py"), "--steps", str(steps), "--log-every", str(log_every),
             "--global-batch-size", str(batch)]
    if not telemetry:
        args.append("--no-telemetry")
    stop, counts = threading.Event(), [0]
    scraper = threading.Thread(target=_scraper, args=(base, nproc, stop, counts), daemon=True)
    if telemetry:
        scraper.start()
    try:
        res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900, check=False)
    finally:
        stop.set()
    if res.returncode != 0:
        raise SystemExit(f"run failed:\n{res.stderr[-3000:]}")
    seconds, done = 0.0, 1
    for m in WINDOW.finditer(res.stdout):
        step, rate = int(m.group(1)), float(m.group(2))
        if step == 1:
            continue
        n = step - done
        seconds += n * batch / rate
        done = step
    return seconds / (done - 1), counts[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--global-batch-size", type=int, default=32)
    args = p.parse_args()
    on, off, ratios = [], [], []
    for i in range(args.pairs):
        order = (True, False) if i % 2 == 0 else (False, True)  # alternate who goes first
        pair = {}
        for telemetry in order:
            pair[telemetry], scrapes = run_once(telemetry, args.steps, args.nproc, args.global_batch_size)
            if telemetry:
                print(f"  pair {i}: on  {pair[True] * 1e3:7.2f} ms/step ({scrapes} scrapes served)",
                      flush=True)
            else:
                print(f"  pair {i}: off {pair[False] * 1e3:7.2f} ms/step", flush=True)
        on.append(pair[True])
        off.append(pair[False])
        ratios.append(pair[True] / pair[False])
    m_on, m_off = statistics.median(on), statistics.median(off)
    pair_median = 100 * (statistics.median(ratios) - 1)
    print(f"median on {m_on * 1e3:.2f} ms/step, off {m_off * 1e3:.2f} ms/step, "
          f"overhead {100 * (m_on / m_off - 1):+.2f} % (median of pair ratios {pair_median:+.2f} %)")


if __name__ == "__main__":
    main()
