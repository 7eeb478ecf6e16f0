"""One rank of the checkpoint-cost benchmark (benchmarks/fault_tolerance.py launches it on 2 ranks).

The example's model, data and AdamW state under DDP, in one job: blocks of steps without checkpoints,
with asynchronous and with synchronous checkpoints every N steps, interleaved (the order rotates
each round), so all three see the same machine. Rank 0 prints one line `RESULT {json}`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from train_ddp import TinyLM, global_batch

import npudist
from npudist import checkpoint
from npudist.checkpoint.writer import writer as checkpoint_writer

MODES = ("none", "async", "sync")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--block-steps", type=int, default=100)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--dir", default=None, help="run directory parent (default: the system temp dir)")
    args = p.parse_args()
    ctx = npudist.init()
    torch.manual_seed(0)
    model = TinyLM(64, 64, 2, 32)
    ddp = DDP(model, broadcast_buffers=False)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    per_rank = 32 // ctx.world_size
    step = 0
    run_dir = [tempfile.mkdtemp(prefix="ckpt-cost-", dir=args.dir) if ctx.rank == 0 else None]
    dist.broadcast_object_list(run_dir, src=0)

    def train_step() -> torch.Tensor:
        nonlocal step
        step += 1
        batch = global_batch(0, step, 32, 32, 64)[ctx.rank * per_rank:(ctx.rank + 1) * per_rank]
        loss = F.cross_entropy(ddp(batch[:, :-1]).reshape(-1, 64), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def block(mode: str) -> dict:
        times, blocked = [], []
        for _ in range(args.block_steps):
            began = time.perf_counter()
            loss = train_step()
            if mode != "none" and step % args.every == 0:
                state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step,
                         "loss": float(loss.detach()), "rng": torch.get_rng_state()}
                t0 = time.perf_counter()
                checkpoint.save(state, run_dir[0], step, async_save=mode == "async")
                blocked.append(time.perf_counter() - t0)
            times.append(time.perf_counter() - began)
        checkpoint_writer().settle(count_wait=False)  # the last write lands outside every timed block
        dist.barrier()
        return {"mode": mode, "step_s": times, "blocked_s": blocked}

    block("none")  # warm-up
    rounds = []
    for r in range(args.rounds):
        order = MODES[r % 3:] + MODES[:r % 3]
        rounds.append({b["mode"]: b for b in (block(m) for m in order)})
    stats = checkpoint.stats()
    gathered = [None] * ctx.world_size
    dist.all_gather_object(gathered, {"rounds": rounds, "waits": stats.waits})
    if ctx.rank == 0:
        print("RESULT " + json.dumps(summarise(gathered, args.every)), flush=True)
    npudist.shutdown()
    if ctx.rank == 0:
        shutil.rmtree(run_dir[0], ignore_errors=True)


def summarise(per_rank: list[dict], every: int) -> dict:
    """Figures over ranks: a save blocks the loop as long as its slowest rank; a step is the ranks' mean."""
    n_rounds = len(per_rank[0]["rounds"])

    def mean_step(r: int, mode: str) -> float:
        return statistics.mean(statistics.mean(rank["rounds"][r][mode]["step_s"]) for rank in per_rank)

    def blocked(mode: str) -> list[float]:
        out = []
        for r in range(n_rounds):
            columns = zip(*(rank["rounds"][r][mode]["blocked_s"] for rank in per_rank), strict=True)
            out.extend(max(c) for c in columns)
        return out

    step_s = statistics.median(mean_step(r, "none") for r in range(n_rounds))
    result = {"every": every, "rounds": n_rounds, "step_seconds_no_checkpoints": step_s,
              "waits_for_previous_write": sum(rank["waits"] for rank in per_rank)}
    for mode in ("async", "sync"):
        b = blocked(mode)
        result[mode] = {
            "save_blocks_median_s": statistics.median(b),
            "save_blocks_mean_s": statistics.mean(b),
            "blocked_share_of_step_time": statistics.mean(b) / (every * step_s),
            "step_time_ratio": statistics.median(mean_step(r, mode) / mean_step(r, "none") for r in range(n_rounds)),
        }
    return result


if __name__ == "__main__":
    main()
