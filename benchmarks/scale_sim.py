"""Diagnosis at sizes this machine cannot launch: the real code replayed at up to 8,192 simulated ranks.

    python benchmarks/scale_sim.py detector [--sizes 2,4,...,8192] [--trials 100] [--aa-windows 10000]
    python benchmarks/scale_sim.py series [--ranks 8192]
    python benchmarks/scale_sim.py store ...      (benchmarks/scale_store.py, where present)

``detector``: every rank's window mean is 1.0 s times 5 % lognormal noise (sigma 0.05 of the log); one rank
(drawn per trial) slows down from the onset window. Scenarios: ``constant`` (1.3x), ``ramp`` (3 % more
per window up to 1.5x: thermal throttling), ``intermittent`` (1.5x in one window out of four) and
``aa`` (no slow rank). Rules side by side, each re-implemented from its documented rule:

- ``detector``: npudist.telemetry.StragglerDetector with default settings.
- ``skew``: the seed's rule, stddev/mean of the window means above 0.12 names the slowest rank.
- ``mindcluster``: a rank 30 % slower than the cluster (its median), three detections in a row
  (MindCluster slow-node detection, hiascend.com "Slow node detection").
- ``nvrx``: relative score = fastest rank's time / this rank's time below 0.7 (nvidia-resiliency-ext
  straggler detection, its ``scores_to_detect`` / ``straggler_perf_threshold`` documentation).

Columns: ``det<=3`` trials whose slow rank is flagged within 3 windows of the onset (ramp: of reaching
1.3x); ``latency`` median windows from that window to the first flag (1 = the window itself); ``false``
windows with any other rank flagged, per 10,000 windows (all scenarios); ``aa`` flagged windows per
10,000 in the A/A run. The slowdown starts once the noise estimate holds about 200 samples
(``--warmup``): 2 windows from 256 ranks up, 201 at 2 (``--onset`` forces a fixed window instead).

``series``: Prometheus series one rank and one job serve, counted from the catalogue and the example's
real collectors, with default settings and with ``op_ranks`` (operator histograms on a subset of ranks).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from npudist.diagnosis.straggler.detector import StragglerDetector  # noqa: E402

SIZES = tuple(2 ** k for k in range(1, 14))  # 2 .. 8,192
NOISE = 0.05
SLOWDOWN = 1.3
WITHIN = 3


# --- baselines, re-implemented from their documented rules --------------------------------------------

class SkewRule:
    """The seed's rule: stddev/mean above 0.12 names the rank with the longest mean."""

    def __init__(self, n: int, threshold: float = 0.12) -> None:
        self.threshold = threshold

    def update(self, means: np.ndarray) -> list[int]:
        skew = float(np.std(means) / np.mean(means))
        return [int(np.argmax(means))] if skew > self.threshold else []


class MindClusterRule:
    """A rank whose time exceeds the cluster's (median) by 30 %, three detections in a row."""

    def __init__(self, n: int, degradation: float = 0.30, in_a_row: int = 3) -> None:
        self.limit, self.in_a_row = 1 + degradation, in_a_row
        self.streak = np.zeros(n, dtype=int)

    def update(self, means: np.ndarray) -> list[int]:
        slow = means > self.limit * np.median(means)
        self.streak = np.where(slow, self.streak + 1, 0)
        return [int(r) for r in np.flatnonzero(self.streak >= self.in_a_row)]


class NvrxRule:
    """Relative score = best rank's time / this rank's time; a straggler scores below 0.7."""

    def __init__(self, n: int, threshold: float = 0.7) -> None:
        self.threshold = threshold

    def update(self, means: np.ndarray) -> list[int]:
        return [int(r) for r in np.flatnonzero(np.min(means) / means < self.threshold)]


RULES: dict[str, Callable[[int], object]] = {
    "detector": StragglerDetector, "skew": SkewRule, "mindcluster": MindClusterRule, "nvrx": NvrxRule}


# --- scenarios ----------------------------------------------------------------------------------------

def constant(k: int) -> float:
    return SLOWDOWN


def ramp(k: int) -> float:
    return min(1.5, 1.0 + 0.03 * (k + 1))


def intermittent(k: int) -> float:
    return 1.5 if k % 4 == 0 else 1.0


SCENARIOS: dict[str, Callable[[int], float]] = {"constant": constant, "ramp": ramp, "intermittent": intermittent}


def reference_window(scenario: str) -> int:
    """Windows after the onset at which the slowdown first reaches 1.3x (detection is counted from there)."""
    factor = SCENARIOS[scenario]
    return next(k for k in range(1000) if factor(k) >= SLOWDOWN - 1e-9)


def warmup_windows(n: int, samples: int) -> int:
    """Windows before the onset so the detector has about ``samples`` noise samples (n - 1 per window)."""
    return 1 + math.ceil(samples / max(1, n - 1))


@dataclass
class Outcome:
    detected: int = 0
    trials: int = 0
    latencies: list[int] | None = None
    false_windows: int = 0
    windows: int = 0
    slow_windows_flagged: int = 0
    slow_windows: int = 0

    def row(self) -> tuple[str, str, str, str]:
        lat = statistics.median(self.latencies) if self.latencies else math.nan
        det = f"{100 * self.detected / self.trials:.0f} %" if self.trials else "-"
        latency = "-" if math.isnan(lat) else f"{lat:g}"
        false = f"{1e4 * self.false_windows / self.windows:.1f}" if self.windows else "-"
        hit = f"{100 * self.slow_windows_flagged / self.slow_windows:.0f} %" if self.slow_windows else "-"
        return det, latency, false, hit


def run_scenario(rule: str, scenario: str, n: int, trials: int, onset: int, rng: np.random.Generator,
                 after: int = 12) -> Outcome:
    """``trials`` jobs of ``onset + after`` windows; the slow rank's first flag counted from the reference."""
    out = Outcome(latencies=[])
    ref = reference_window(scenario)
    factor = SCENARIOS[scenario]
    windows = onset + ref + after
    for _ in range(trials):
        det = RULES[rule](n)
        slow = int(rng.integers(n))
        noise = np.exp(rng.normal(0.0, NOISE, (windows, n)))
        first = None
        for w in range(windows):
            means = noise[w]
            k = w - onset
            if k >= 0:
                means = means.copy()
                means[slow] *= factor(k)
            flagged = det.update(means)  # type: ignore[attr-defined]
            out.windows += 1
            if any(r != slow for r in flagged):
                out.false_windows += 1
            if k >= 0 and factor(k) > 1.0:
                out.slow_windows += 1
                out.slow_windows_flagged += slow in flagged
            if first is None and k >= ref and slow in flagged:
                first = k - ref + 1
        out.trials += 1
        if first is not None:
            out.latencies.append(first)
            out.detected += first <= WITHIN
    return out


def run_aa(rule: str, n: int, windows: int, rng: np.random.Generator, chunk: int = 1000) -> Outcome:
    out = Outcome()
    det = RULES[rule](n)
    for start in range(0, windows, chunk):
        noise = np.exp(rng.normal(0.0, NOISE, (min(chunk, windows - start), n)))
        for means in noise:
            out.windows += 1
            out.false_windows += bool(det.update(means))  # type: ignore[attr-defined]
    return out


def _sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(s) for s in text.split(",") if s)
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError("sizes are world sizes >= 2, comma-separated")
    return sizes


def cmd_detector(args: argparse.Namespace) -> int:
    rng = np.random.default_rng(args.seed)
    rules = args.rules.split(",")
    unknown = set(rules) - set(RULES)
    if unknown:
        raise SystemExit(f"unknown rule(s) {sorted(unknown)}; choose from {sorted(RULES)}")
    print(f"# noise {NOISE:.0%} lognormal per window, slow rank {SLOWDOWN}x, trials {args.trials}, "
          f"A/A {args.aa_windows} windows, seed {args.seed}")
    print("| N | rule | constant det<=3 | latency | ramp det<=3 | latency | intermittent slow windows flagged "
          "| false /10k | A/A /10k |")
    print("|---|---|---|---|---|---|---|---|---|")
    started = time.perf_counter()
    for n in args.sizes:
        onset = args.onset if args.onset is not None else warmup_windows(n, args.warmup)
        for rule in rules:
            res = {s: run_scenario(rule, s, n, args.trials, onset, rng) for s in SCENARIOS}
            aa = run_aa(rule, n, args.aa_windows, rng) if args.aa_windows else Outcome()
            false = sum(r.false_windows for r in res.values())
            windows = sum(r.windows for r in res.values())
            c, r, i = res["constant"].row(), res["ramp"].row(), res["intermittent"].row()
            print(f"| {n} | {rule} | {c[0]} | {c[1]} | {r[0]} | {r[1]} | {i[3]} | "
                  f"{1e4 * false / windows:.1f} | {aa.row()[2]} |", flush=True)
    print(f"# {time.perf_counter() - started:.0f} s")
    return 0


# --- series -------------------------------------------------------------------------------------------

RANK0_ONLY = ("npudist_step_skew_ratio", "npudist_straggler_rank")
"""Families only rank 0 serves (the job's skew; the flagged rank, one sample while a rank is flagged)."""
OP_FAMILY = "npudist_op_duration_seconds"


def measure_rank_series(steps: int, port: int) -> dict[str, int]:
    """Series per metric family that one real rank of examples/train_ddp.py serves after ``steps`` steps
    (a 1-rank gloo group in this process: the same collectors, the DDP hook, one profiled step)."""
    import os

    import torch
    from prometheus_client import generate_latest

    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    sys.path.insert(0, str(REPO / "examples"))
    import train_ddp as example

    import npudist
    import npudist.telemetry

    ctx = npudist.init("gloo")
    args = example.parse_args(["--steps", str(steps)])
    try:
        torch.manual_seed(0)
        model = example.TinyLM(args.vocab, args.d_model, args.layers, args.seq_len, args.activation)
        ddp = npudist.ddp(model)
        opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
        telemetry = npudist.telemetry.serve_rank_metrics(ctx, env={}, device_source="cpu")
        timer = telemetry.step_timer(exchange_every=20, op_every=steps)  # the example: ops every 100
        npudist.telemetry.watch_ddp(ddp, timer)
        timer.step()
        for step in range(1, steps + 1):
            example.train_step(ddp, opt, args, step, ctx, timer.data_wait)
            timer.step()
        text = generate_latest(telemetry.registry).decode()
        telemetry.close()
    finally:
        npudist.shutdown()
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: len(f.samples) for f in text_string_to_metric_families(text) if f.samples}


def job_series(per_family: dict[str, int], ranks: int, op_ranks: int) -> tuple[int, int, int]:
    """(rank 0, another rank that profiles no operators or does, job total) for one setting."""
    from npudist.telemetry.job.op_sampling import samples_ops

    total_rank0 = sum(per_family.values())
    rank0_only = sum(v for k, v in per_family.items() if k in RANK0_ONLY)
    ops = sum(v for k, v in per_family.items() if k.startswith(OP_FAMILY))
    other = total_rank0 - rank0_only - (0 if samples_ops(ranks - 1, ranks, op_ranks) else ops)
    samplers = sum(samples_ops(r, ranks, op_ranks) for r in range(ranks))
    job = ranks * (total_rank0 - rank0_only - ops) + rank0_only + samplers * ops
    return total_rank0, other, job


def cmd_series(args: argparse.Namespace) -> int:
    per_family = measure_rank_series(args.steps, args.master_port)
    ops = sum(v for k, v in per_family.items() if k.startswith(OP_FAMILY))
    print(f"# one real rank of examples/train_ddp.py after {args.steps} steps: {sum(per_family.values())} series, "
          f"{ops} of them the operator histogram")
    print(f"| setting | series on rank 0 | series on rank {args.ranks - 1} | series per {args.ranks:,}-rank job "
          "| per rank |")
    print("|---|---|---|---|---|")
    for name, op_ranks in (("default (every rank profiles operators)", 0), (f"op_ranks={args.op_ranks}",
                                                                            args.op_ranks)):
        rank0, other, job = job_series(per_family, args.ranks, op_ranks)
        print(f"| {name} | {rank0} | {other} | {job:,} | {job / args.ranks:.1f} |")
    return 0


# --- subcommands; `store` lives in benchmarks/scale_store.py ------------------------------------------

def _load(module: str) -> object | None:
    path = Path(__file__).with_name(f"{module}.py")
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(module, path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


EXTERNAL = {"store": "scale_store", "bound": "straggler_bound"}
"""Subcommands whose code lives in a sibling module with its own ``main(argv)``: arguments pass through."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("detector", help="straggler rules replayed at N = 2..8,192")
    d.add_argument("--sizes", type=_sizes, default=SIZES)
    d.add_argument("--trials", type=int, default=100)
    d.add_argument("--aa-windows", type=int, default=10000)
    d.add_argument("--rules", default=",".join(RULES))
    d.add_argument("--warmup", type=int, default=200, help="noise samples the detector has before the onset")
    d.add_argument("--onset", type=int, default=None, help="fixed onset window (overrides --warmup)")
    d.add_argument("--seed", type=int, default=2020)
    d.set_defaults(func=cmd_detector)
    s = sub.add_parser("series", help="Prometheus series per rank and per job")
    s.add_argument("--ranks", type=int, default=8192)
    s.add_argument("--steps", type=int, default=100, help="steps of the real rank (one profiled step at the end)")
    s.add_argument("--op-ranks", type=int, default=64, help="ranks that profile operators in the second row")
    s.add_argument("--master-port", type=int, default=29650)
    s.set_defaults(func=cmd_series)
    for name, module in EXTERNAL.items():
        mod = _load(module)
        if mod is None:
            sub.add_parser(name, help=f"(needs benchmarks/{module}.py)").set_defaults(
                func=lambda a, m=module: sys.exit(f"benchmarks/{m}.py is not in this checkout"))
        else:
            e = sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0], add_help=False)
            e.add_argument("argv", nargs=argparse.REMAINDER, help=f"arguments of benchmarks/{module}.py")
            e.set_defaults(func=lambda a, m=mod: m.main(a.argv))  # type: ignore[attr-defined]
    return p


def main(argv: Iterable[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in EXTERNAL and (mod := _load(EXTERNAL[argv[0]])) is not None:
        return int(mod.main(argv[1:]) or 0)  # type: ignore[attr-defined]  # its own options, --help included
    args = parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
