"""Step time of npudist.ddp over plain DDP's default hook, measured inside one job.

    python -m npudist launch --nproc-per-node 2 benchmarks/ddp_ab.py [--pairs 10] [--block 200] [--aa] [--json out.json]

Both arms train the example's model (examples/train_ddp.py: same architecture, seed, data and batch):
"npudist" wrapped by npudist.ddp (each gradient bucket through npudist's numbered, counted all_reduce),
"plain" by DistributedDataParallel with its built-in hook. They run in alternating blocks of ``--block``
steps (order ABBA, so a drift in machine load cancels), with fresh model copies every pair, built in
block order, as benchmarks/telemetry_ab.py does. Each block's time is rank 0's wall time (DDP keeps the
ranks in step); pair 0 is warm-up. Reported: median npudist / median plain, and the median of the
per-pair ratios. Target (issue 13): <= 1.02. ``--aa`` wraps both arms in plain DDP: its ratio is the
method's own error on this machine. Also reported, the same ratios of rank 0's process CPU time per
block (all its threads, gloo's included): what the hook costs in work, which other jobs on a shared
machine disturb much less than they disturb wall time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import npudist

REPO = Path(__file__).resolve().parent.parent


def _example():
    spec = importlib.util.spec_from_file_location("train_ddp", REPO / "examples" / "train_ddp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=10, help="measured pairs (one more runs as warm-up)")
    p.add_argument("--block", type=int, default=200, help="steps per block")
    p.add_argument("--aa", action="store_true", help="calibration: plain DDP in both arms (A/A)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    ex = _example()
    cfg = ex.parse_args([])
    ctx = npudist.init()

    def build(name: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(cfg.seed)
        model = ex.TinyLM(cfg.vocab, cfg.d_model, cfg.layers, cfg.seq_len, cfg.activation)
        # The model holds no buffer (the example makes its mask per forward): neither arm syncs buffers per step.
        wrapped = npudist.ddp(model) if name == "npudist" and not args.aa else DDP(model)
        return wrapped, torch.optim.AdamW(wrapped.parameters(), lr=cfg.lr)

    step = {"npudist": 0, "plain": 0}

    def block(name: str, copies: dict) -> tuple[float, float]:
        model, opt = copies[name]
        torch.distributed.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.block):
            step[name] += 1
            ex.train_step(model, opt, cfg, step[name], ctx)
        return time.perf_counter() - start, time.process_time() - cpu

    rows = []
    for pair in range(args.pairs + 1):
        order = ("npudist", "plain") if pair % 2 == 0 else ("plain", "npudist")
        copies = {name: build(name) for name in order}
        times = {name: block(name, copies) for name in order}
        if pair and ctx.rank == 0:
            (a, a_cpu), (b, b_cpu) = times["npudist"], times["plain"]
            rows.append({"pair": pair, "npudist_s": a, "plain_s": b, "ratio": a / b, "npudist_cpu_s": a_cpu,
                         "plain_cpu_s": b_cpu, "cpu_ratio": a_cpu / b_cpu})
            print(f"  pair {pair}: npudist {a / args.block * 1e3:7.2f} ms/step, plain {b / args.block * 1e3:7.2f} "
                  f"ms/step, ratio {a / b:.4f}; cpu ratio {a_cpu / b_cpu:.4f}", flush=True)
    calls = npudist.comm.stats().get("all_reduce")
    if ctx.rank == 0:
        def med(key: str) -> float:
            return statistics.median(r[key] for r in rows)

        result = {"aa": args.aa, "block_steps": args.block, "pairs": rows,
                  "median_npudist_ms_per_step": med("npudist_s") / args.block * 1e3,
                  "median_plain_ms_per_step": med("plain_s") / args.block * 1e3,
                  "ratio": med("npudist_s") / med("plain_s"), "median_pair_ratio": med("ratio"),
                  "cpu_ratio": med("npudist_cpu_s") / med("plain_cpu_s"), "median_pair_cpu_ratio": med("cpu_ratio"),
                  "bucket_all_reduces_recorded": calls.calls if calls else 0}
        print(f"{'A/A (plain in both arms): ' if args.aa else ''}median npudist.ddp "
              f"{result['median_npudist_ms_per_step']:.2f} ms/step, plain DDP {result['median_plain_ms_per_step']:.2f}"
              f" ms/step: ratio {result['ratio']:.4f} (median of pair ratios {result['median_pair_ratio']:.4f}); "
              f"CPU time ratio {result['cpu_ratio']:.4f} ({result['median_pair_cpu_ratio']:.4f}); "
              f"{result['bucket_all_reduces_recorded']} bucket all_reduces recorded", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
    npudist.shutdown()


if __name__ == "__main__":
    main()
