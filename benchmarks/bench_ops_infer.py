"""Figures for npudist.ops and npudist.infer, printed as Markdown tables.

    python benchmarks/bench_ops_infer.py            # both parts
    python benchmarks/bench_ops_infer.py --part swish
    python benchmarks/bench_ops_infer.py --part aggregate --ranks 4

swish: the custom operator's reference (fallback) path vs torch.nn.SiLU on CPU, forward and
forward+backward, as a time ratio (> 1: the custom op is slower). aggregate: the all-reduce part of an
ensemble request on N CPU ranks over gloo, by payload size (batch x classes float32 values).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

SRC = Path(__file__).resolve().parent.parent / "src"


def _median_seconds(fn: Callable[[], object], reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_swish(reps: int) -> None:
    from npudist.ops import Swish

    torch.manual_seed(0)
    ours, silu = Swish(1.0), torch.nn.SiLU()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, float32 on CPU, median of {reps}\n")
    print("| elements | pass | nn.SiLU (s) | Swish op fallback (s) | ratio |")
    print("|---:|---|---:|---:|---:|")
    for n in (1 << 10, 1 << 16, 1 << 20):
        x = torch.randn(n)
        xg = x.clone().requires_grad_()
        for label, make in (("forward", lambda m, x=x: (lambda: m(x))),
                            ("fwd+bwd", lambda m, xg=xg: (lambda: m(xg).sum().backward()))):
            t_silu = _median_seconds(make(silu), reps)
            t_ours = _median_seconds(make(ours), reps)
            print(f"| {n} | {label} | {t_silu:.2e} | {t_ours:.2e} | {t_ours / t_silu:.2f} |")
    print()


def aggregate_worker(sizes: list[int], reps: int) -> None:
    import npudist
    from npudist.infer import EnsembleServer, TorchRunner

    ctx = npudist.init()
    try:
        classes = 10
        runner = TorchRunner(torch.nn.Identity(), torch.device("cpu"))
        server = EnsembleServer(runner, classes, combine="mean_logits")
        rows = []
        for values in sizes:
            batch = torch.randn(max(values // classes, 1), classes)
            for _ in range(3):
                server.predict(batch)
            agg = [server.predict(batch).aggregate_seconds for _ in range(reps)]
            rows.append((values, batch.numel() * 4, statistics.median(agg), max(agg)))
        if ctx.is_main:
            print(f"{ctx.world_size} CPU ranks over gloo on 127.0.0.1, median of {reps} requests\n")
            print("| values (batch x 10) | prediction bytes | aggregate median (s) | aggregate max (s) |")
            print("|---:|---:|---:|---:|")
            for values, nbytes, med, worst in rows:
                print(f"| {values} | {nbytes} | {med:.2e} | {worst:.2e} |")
            print(flush=True)
    finally:
        npudist.shutdown()


def bench_aggregate(ranks: int, reps: int, sizes: list[int]) -> int:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "npudist", "launch", "--nproc-per-node", str(ranks), __file__, "--worker",
            "--reps", str(reps), "--sizes", *map(str, sizes)]
    proc = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=600, check=False)
    print(proc.stdout, end="")
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
    return proc.returncode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("all", "swish", "aggregate"), default="all")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--sizes", type=int, nargs="+", default=[10, 1_000, 100_000, 1_000_000])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        aggregate_worker(args.sizes, args.reps)
        return 0
    if args.part in ("all", "swish"):
        bench_swish(args.reps)
    if args.part in ("all", "aggregate"):
        return bench_aggregate(args.ranks, args.reps, args.sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
