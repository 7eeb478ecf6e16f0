"""DDP training of a small transformer language model on seeded synthetic data, on any accelerator.

    npudist launch --nproc-per-node 2 examples/train_ddp.py --steps 100

The batch for a step is a pure function of (seed, step), split across ranks, so the global batch is
the same whatever the world size and a resumed run sees exactly the samples of an uninterrupted one.
With --run-dir it checkpoints every --checkpoint-every steps (written in the background unless
--sync-checkpoints) and resumes from the newest good checkpoint on start, so a killed and restarted
run ends bit-for-bit where an uninterrupted one does. A second job started on a run directory that
a live job holds exits at once, naming the holder.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import inspect
import math
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import npudist
from npudist import checkpoint
from npudist.telemetry.job.console import Interrupt, interrupted_line
from npudist.testing import train_knobs as knobs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-dir", default=None, help="checkpoints go here; the run resumes from them")
    p.add_argument("--resume-simulated", action="store_true",
                   help="resume from a checkpoint a simulated NPU run wrote (refused on a real device otherwise)")
    p.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints (with --run-dir)")
    p.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
    p.add_argument("--sync-checkpoints", action="store_true",
                   help="write checkpoints in the training loop instead of in the background")
    p.add_argument("--straggler-diagnosis", type=int, default=0, metavar="WINDOWS",
                   help="with --run-dir: write a straggler diagnosis once the detector flags a rank in this "
                        "many windows in a row")
    p.add_argument("--exchange-every", type=int, default=20, help="steps between cross-rank skew exchanges")
    p.add_argument("--op-ranks", type=int, default=0,
                   help="profile operators on about this many ranks spread over the job (0 = every rank)")
    p.add_argument("--global-batch-size", type=int, default=32, help="sequences per step over all ranks")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--activation", choices=ACTIVATIONS, default="relu",
                   help="feed-forward activation; swish-op is npudist.ops.Swish (beta 1, the SiLU maths) "
                   "through the custom operator")
    p.add_argument("--no-telemetry", action="store_true",
                   help="no step timer, skew exchange, op sampling or metrics server (overhead baseline)")
    knobs.add_arguments(p)  # testing: faults, slow ranks, holds (npudist/testing/train_knobs.py)
    args = p.parse_args(argv)
    for name in ("steps", "exchange_every", "checkpoint_every", "keep", "global_batch_size", "seq_len", "vocab",
                 "d_model", "layers", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


ACTIVATIONS = ("relu", "silu", "swish-op")
def make_activation(name: str) -> str | nn.Module:
    """An activation TransformerEncoderLayer accepts; none of them draws random numbers or has weights."""
    if name == "swish-op":
        from npudist.ops import Swish

        return Swish(1.0)
    return nn.SiLU() if name == "silu" else name


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, seq_len: int, activation: str = "relu") -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=2 * d_model, dropout=0.0,
                                           batch_first=True, norm_first=True,
                                           activation=make_activation(activation))
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:t]
        x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
        return self.head(x)


def global_batch(seed: int, step: int, n: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Sequences that follow x[i+1] = (5*x[i] + 3) mod vocab with 10% random tokens: learnable, seeded."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    steps = torch.arange(seq_len + 1)
    seq = start.clone().expand(n, seq_len + 1).clone()
    for i in range(1, seq_len + 1):
        seq[:, i] = (5 * seq[:, i - 1] + 3) % vocab
    noise = torch.rand(n, seq_len + 1, generator=g) < 0.1
    seq = torch.where(noise, torch.randint(0, vocab, seq.shape, generator=g), seq)
    del steps
    return seq


# No per-step buffer sync: the only buffer is the constant causal mask, and a per-step broadcast would
# be a hidden collective where fast ranks wait for slow ones. torch 2.13 renamed the option.
NO_BUFFER_SYNC = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
                  else {"broadcast_buffers": False})


def train_step(model: nn.Module, opt: torch.optim.Optimizer, args: argparse.Namespace, step: int,
               ctx: npudist.DistContext,
               data_wait: Callable[[], AbstractContextManager] = contextlib.nullcontext) -> torch.Tensor:
    """One optimizer step on this rank's share of the step's global batch; returns the loss. Building the
    batch runs under ``data_wait`` (the step timer's), so a rank slowed by its data is named as such."""
    per_rank = args.global_batch_size // ctx.world_size
    with data_wait():
        batch = global_batch(args.seed, step, args.global_batch_size, args.seq_len, args.vocab)
        mine = batch[ctx.rank * per_rank:(ctx.rank + 1) * per_rank].to(ctx.device)
    knobs.inject(args, step, ctx.rank, "start")
    logits = model(mine[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, args.vocab), mine[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    knobs.inject(args, step, ctx.rank, "backward")
    loss.backward()
    opt.step()
    knobs.inject(args, step, ctx.rank, "end")
    if not knobs.loss_average(args, loss, step, ctx.rank):
        raise StopIteration
    return loss


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        # The tensor's bytes without numpy: torch < 2.3 cannot load numpy 2, which pip installs by default.
        h.update(bytes(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).tolist()))
    return h.hexdigest()


def resume(run_dir: str | None, model: nn.Module, opt: torch.optim.Optimizer, ctx: npudist.DistContext,
           peer: checkpoint.PeerSnapshots | None = None,
           allow_simulated: bool = False) -> tuple[int, float, str | None]:
    """Load the freshest copy every rank holds (an in-memory peer snapshot with `npudist launch
    --peer-snapshots K`, else the newest good checkpoint) into model and optimizer; (0, nan, None) when
    starting fresh, else (step, loss, where the state came from)."""
    try:
        found = checkpoint.restore(run_dir, peer, allow_simulated=allow_simulated)
    except checkpoint.CheckpointError as exc:  # every rank reads the same manifest, so all stop here
        raise SystemExit(f"train_ddp.py: {exc}") from None
    if found is None:
        return 0, math.nan, None
    model.load_state_dict(found.state["model"])
    opt.load_state_dict(found.state["optim"])
    torch.set_rng_state(found.state["rng"])
    if ctx.is_main:
        print(f"resumed from step={found.step} run_dir={run_dir}", flush=True)
        print(found.line, flush=True)
    return found.step, float(found.state["loss"]), found.source


def claim_run_dir(run_dir: str) -> checkpoint.RunDirLock | None:
    """One job per run directory: rank 0 holds the lock until the run ends; a second job stops here."""
    try:
        return checkpoint.lock_run_dir(run_dir)
    except checkpoint.CheckpointError as exc:
        npudist.shutdown()
        raise SystemExit(f"train_ddp.py: {exc}") from None


def last_checkpoint(run_dir: str | None) -> str:
    steps = checkpoint.list_checkpoints(run_dir) if run_dir else []
    return f"step {max(steps)} in {run_dir}" if steps else "none"


class Position:
    """Where the run is, for the line Ctrl-C prints: rank 0 prints it (before init, RANK says who that is)."""

    def __init__(self) -> None:
        self.step = 0
        self.is_main = os.environ.get("RANK", "0") == "0"


def train(args: argparse.Namespace, at: Position) -> None:
    knobs.hold(args, int(os.environ.get("RANK", "0")), "init")
    ctx = npudist.init(watch=False)  # the loop starts below, with this script's settings
    at.is_main = ctx.is_main
    if args.run_dir:
        claim_run_dir(args.run_dir)  # held until npudist.shutdown()
    if args.global_batch_size % ctx.world_size:
        raise SystemExit(f"--global-batch-size {args.global_batch_size} must divide by the world size "
                         f"{ctx.world_size}")
    torch.manual_seed(args.seed)  # identical initial weights on every rank (DDP also broadcasts them)
    model = TinyLM(args.vocab, args.d_model, args.layers, args.seq_len, args.activation).to(ctx.device)
    # Gradient buckets go through npudist.comm: adapted to the backend, numbered for hang diagnosis, counted.
    ddp = npudist.ddp(model, **NO_BUFFER_SYNC)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    peer = checkpoint.peer_snapshots(ctx.rank, ctx.world_size, ctx.local_world_size)
    start, loss_value, source = resume(args.run_dir, model, opt, ctx, peer, args.resume_simulated)
    at.step = start
    if start:
        knobs.hold(args, ctx.rank, "resume")
    if start >= args.steps and ctx.is_main:
        print(f"already at step {start} in {args.run_dir}: raise --steps (make demo STEPS=...) above {start} "
              f"or remove {args.run_dir}", flush=True)
    if args.run_dir:
        npudist.comm.set_run_dir(args.run_dir)
    # Step times, skew windows, the rank's metrics (on NPUDIST_METRICS_PORT + local rank when set), the run
    # log `npudist report RUN_DIR` plots and rank 0's progress line: the optimizer's step marks each step.
    loop = npudist.loop(total_steps=args.steps, start_step=start, log_every=args.log_every,
                        samples_per_step=args.global_batch_size, run_dir=args.run_dir, resume_source=source,
                        exchange_every=args.exchange_every, op_ranks=args.op_ranks,
                        straggler_diagnosis=args.straggler_diagnosis, telemetry=not args.no_telemetry)
    saved = last = None
    slow_down = knobs.Slowdown(args, ctx.rank)
    for step in range(start + 1, args.steps + 1):
        began = time.perf_counter()
        try:
            loss = train_step(ddp, opt, args, step, ctx, loop.data_wait)
            at.step = step
        except StopIteration:  # --fault skip
            break
        except Exception:
            knobs.dump_flight_recorder(ctx.rank)
            raise
        last = loss
        npudist.log(loss=loss)  # read only when a progress line needs it
        slow_down(step, began)
        if peer is not None and peer.due(step):  # the state a disk checkpoint would hold, to the partner
            peer.snapshot({"model": model.state_dict(), "optim": opt.state_dict(), "step": step,
                           "loss": float(loss.detach()), "rng": torch.get_rng_state()}, step)
        if args.run_dir and (step % args.checkpoint_every == 0 or step == args.steps):
            loss_value = float(loss.detach())
            first = saved is None
            saved = checkpoint.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step,
                                     "loss": loss_value, "rng": torch.get_rng_state()}, args.run_dir, step,
                                    keep=args.keep, async_save=not args.sync_checkpoints)
            if first:
                knobs.hold(args, ctx.rank, "checkpoint")
    if last is not None:
        loss_value = float(last.detach())
    loop.flush()  # the last step's line
    if args.every_rank_done or ctx.is_main:
        print(f"rank={ctx.rank} done steps={args.steps}", flush=True)
    if ctx.is_main:
        print(f"final step={args.steps} loss={loss_value:.6f} params_sha256={params_sha256(model)}", flush=True)
        if isinstance(saved, checkpoint.SaveHandle):
            saved.wait()  # the summary names the checkpoints on disk
    loop.finish(checkpoints=bool(args.run_dir))  # rank 0's summary: stragglers, diagnoses, checkpoints


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    stop = Interrupt()
    at = Position()
    try:
        train(args, at)
    except BaseException as exc:
        if not stop.caused(exc):
            raise
        if at.is_main:  # before the teardown, which may wait on peers that already left
            print(interrupted_line(at.step, last_checkpoint(args.run_dir)), flush=True)
        raise SystemExit(130) from None
    finally:
        # Ends what this rank started, in one order: run log, metrics server and poller, the last
        # background checkpoint write, the process group, then the run-directory lock.
        npudist.shutdown()


if __name__ == "__main__":
    main()
