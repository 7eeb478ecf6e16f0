"""What the live per-rank phases (npudist_rank_phase_seconds_total) cost a step, with and without them.

    python benchmarks/phase_cost.py                  # 7 interleaved pairs of 300 example steps; 200,000 timer steps
    python benchmarks/phase_cost.py --pairs 3 --steps 100

Two measurements, each against the same run without the phase accounting (its split, its counters and
the comm counter read are replaced by no-ops in this process; everything else the step timer does stays):

1. the phase path alone: ``add_data_wait`` with its start time and ``StepTimer.step()`` with a comm
   counter, the calls a watched loop makes per step, 200,000 times per variant, median of 5;
2. the example's step: examples/train_ddp.py's TinyLM at its defaults (global batch 32, seq 32, d_model 64,
   2 layers; one process, no process group, so no DDP), its batch built under the watched loop's
   ``data_wait`` and its step ended by the optimizer hook, as under ``npudist launch --metrics-port``, with
   the skew exchange every 20 steps. Pairs of runs alternate their order; the ratio is of the medians of
   per-run mean step times. On a shared host an A/A pair spreads more than the 0.5 % to resolve, so the
   first figure, divided by the step time, is the cost's upper bound that matters.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from train_ddp import TinyLM, global_batch

from npudist.diagnosis.straggler.phases import StepPhases
from npudist.telemetry.job import loop_hooks, step_timer
from npudist.telemetry.job.loop import LoopSettings, TrainingLoop
from npudist.telemetry.job.step_timer import StepTimer, TrainingMetrics

CTX = SimpleNamespace(rank=1, world_size=1, is_main=False, accelerator=SimpleNamespace(name="cpu"), backend="gloo")
_NONE = StepPhases()


@contextlib.contextmanager
def phases(on: bool) -> Iterator[None]:
    """The phase accounting as shipped (``on``), or replaced by no-ops: the baseline."""
    if on:
        yield
        return
    split, observe = step_timer.split_step, TrainingMetrics.observe_phases
    step_timer.split_step = lambda **_: _NONE
    TrainingMetrics.observe_phases = lambda self, p: None
    try:
        yield
    finally:
        step_timer.split_step, TrainingMetrics.observe_phases = split, observe


def timer_alone(calls: int, on: bool) -> float:
    """Seconds per step of the timer's per-step calls (data wait with its start, step end, comm read)."""
    with phases(on):
        timer = StepTimer(exchange_every=0)
        comm = [0.0]
        if on:
            timer.count_comm(lambda: comm[0])
        timer.step()
        clock = time.perf_counter
        began = clock()
        for _ in range(calls):
            timer.add_data_wait(1e-5, clock())
            comm[0] += 1e-5
            timer.step()
        return (clock() - began) / calls


def example(steps: int, on: bool) -> tuple[float, float]:
    """Mean wall and CPU seconds per step of the example's model under the watched loop (CPU time: this
    process's, so other processes on a shared host move it less than the wall clock)."""
    torch.manual_seed(0)
    model = TinyLM(64, 64, 2, 32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with phases(on):
        loop = TrainingLoop(CTX, LoopSettings(start_step=0, log_every=10**9, telemetry=True))
        loop.start()
        loop.timer = StepTimer(exchange_every=20)
        loop.timer.step()
        uninstall = loop_hooks.install(loop)
        try:
            began, cpu = time.perf_counter(), time.process_time()
            for step in range(steps):
                with loop.data_wait():
                    batch = global_batch(0, step, 32, 32, 64)
                logits = model(batch[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, 64), batch[:, 1:].reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            return (time.perf_counter() - began) / steps, (time.process_time() - cpu) / steps
        finally:
            uninstall()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--calls", type=int, default=200_000)
    args = p.parse_args()
    torch.set_num_threads(1)
    alone = {True: [], False: []}
    for i in range(5):
        for on in ((True, False) if i % 2 else (False, True)):
            alone[on].append(timer_alone(args.calls, on))
    with_us, without_us = (statistics.median(alone[v]) * 1e6 for v in (True, False))
    example(20, True)  # warm-up: allocator, autograd graph caches
    runs = {True: [], False: []}
    for i in range(args.pairs):
        for on in ((True, False) if i % 2 else (False, True)):  # alternating order: no drift lands on one side
            runs[on].append(example(args.steps, on))
    on_s, off_s = (statistics.median(w for w, _ in runs[v]) for v in (True, False))
    on_cpu, off_cpu = (statistics.median(c for _, c in runs[v]) for v in (True, False))
    added = (with_us - without_us) * 1e-6
    print(f"torch {torch.__version__}")
    print(f"timer per-step calls: {with_us:.2f} us with phases, {without_us:.2f} us without: "
          f"+{with_us - without_us:.2f} us/step ({args.calls} calls x 5, median)")
    print(f"example step (TinyLM defaults, {args.pairs} pairs x {args.steps} steps): {on_s * 1e3:.3f} ms with, "
          f"{off_s * 1e3:.3f} ms without: ratio {on_s / off_s:.4f} (pair ratios "
          f"{', '.join(f'{a[0] / b[0]:.3f}' for a, b in zip(runs[True], runs[False], strict=True))})")
    print(f"  CPU time of this process: {on_cpu * 1e3:.3f} ms with, {off_cpu * 1e3:.3f} ms without: ratio "
          f"{on_cpu / off_cpu:.4f} (pair ratios "
          f"{', '.join(f'{a[1] / b[1]:.3f}' for a, b in zip(runs[True], runs[False], strict=True))})")
    print(f"the phase path's cost over the example's step: {added / off_s:.3%} ({added * 1e3:.4f} ms per step)")


if __name__ == "__main__":
    main()
