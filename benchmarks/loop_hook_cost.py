"""What the watched loop (npudist.training) adds to a step, in microseconds on the training thread.

    python benchmarks/loop_hook_cost.py            # 20,000 steps a variant, median of 5 repeats
    python benchmarks/loop_hook_cost.py --steps 2000 --repeats 3

One process, no process group: a tiny model's SGD step with a batch from a plain DataLoader, timed
(a) bare, (b) with the loop's hooks and bookkeeping but no StepTimer (``telemetry=False``), (c) with the
StepTimer the loop drives (no skew exchange: that is the timer's own cost, measured in cpu_cost.py).
The difference to (a) is the per-step cost of the optimizer post-step hook, the DataLoader ``__next__``
wrapper and the loop's step accounting; no line is printed (rank 1's view) so the console is not timed.
Wall-clock differences of a few microseconds drown in a shared host's noise, so the loop's own work is
also timed alone: the calls the two hooks make per step (``fetched`` and ``optimizer_stepped``), 100,000
times, without torch's step around them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch
from torch.utils.data import DataLoader, TensorDataset

from npudist.telemetry.job import loop_hooks
from npudist.telemetry.job.loop import LoopSettings, TrainingLoop
from npudist.telemetry.job.step_timer import StepTimer

CTX = SimpleNamespace(rank=1, world_size=2, is_main=False, accelerator=SimpleNamespace(name="cpu"), backend="gloo")


def run(steps: int, variant: str) -> float:
    """Seconds per step of ``steps`` steps under ``variant`` (bare, hooks, timer)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(torch.randn(steps, 4), torch.randn(steps, 1)), batch_size=1)
    uninstall = None
    if variant != "bare":
        loop = TrainingLoop(CTX, LoopSettings(start_step=0, log_every=10**9, telemetry=variant == "timer"))
        loop.start()
        if variant == "timer":
            loop.timer = StepTimer(exchange_every=0)
            loop.timer.step()
        uninstall = loop_hooks.install(loop)
    try:
        began = time.perf_counter()
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return (time.perf_counter() - began) / steps
    finally:
        if uninstall is not None:
            uninstall()


def direct(calls: int, timer: bool) -> float:
    """Seconds per step of the loop's own per-step calls, alone."""
    loop = TrainingLoop(CTX, LoopSettings(start_step=0, log_every=10**9, telemetry=timer)).start()
    if timer:
        loop.timer = StepTimer(exchange_every=0)
        loop.timer.step()
    batch, opt = (torch.zeros(1, 4), torch.zeros(1, 1)), torch.optim.SGD(torch.nn.Linear(1, 1).parameters())
    clock = time.perf_counter
    began = clock()
    for _ in range(calls):
        at = clock()
        loop.fetched(batch, clock() - at, at, None)
        loop.optimizer_stepped(opt)
    return (clock() - began) / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    run(200, "hooks")  # warm-up: imports, allocator
    per = {v: [] for v in ("bare", "hooks", "timer")}
    for i in range(args.repeats):
        # Interleaved, in alternating order, so a slow spell of the host (or the first run's warm-up of the
        # allocator) does not land on one variant.
        for variant in (list(per) if i % 2 else list(per)[::-1]):
            per[variant].append(run(args.steps, variant))
    bare = statistics.median(per["bare"])
    print(f"torch {torch.__version__}, {args.steps} steps x {args.repeats} repeats, median seconds per step")
    for variant, values in per.items():
        med = statistics.median(values)
        print(f"{variant:6s} {med * 1e6:8.1f} us/step  +{(med - bare) * 1e6:6.1f} us  ({med / bare:.3f}x)")
    for timer in (False, True):
        alone = statistics.median(direct(100_000, timer) for _ in range(args.repeats))
        print(f"the loop's per-step calls alone, {'with' if timer else 'without'} its StepTimer: "
              f"{alone * 1e6:.1f} us/step")


if __name__ == "__main__":
    main()
