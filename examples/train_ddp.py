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
import os
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

import npudist
from npudist import checkpoint
from npudist.telemetry.job.console import Interrupt, interrupted_line
from npudist.testing import train_knobs as knobs

# Feed-forward activations TransformerEncoderLayer accepts; none draws random numbers or has weights.
ACTIVATIONS = {"relu": lambda: "relu", "silu": nn.SiLU, "swish-op": lambda: npudist.ops.Swish(1.0)}


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


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, seq_len: int, activation: str = "relu") -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=2 * d_model, dropout=0.0,
                                           batch_first=True, norm_first=True, activation=ACTIVATIONS[activation]())
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:t]
        # The causal mask is made here rather than held as a buffer: DDP broadcasts a model's buffers before
        # every forward, a hidden collective in which fast ranks would wait for slow ones.
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        return self.head(self.blocks(x, mask=mask, is_causal=True))


def global_batch(seed: int, step: int, n: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Sequences that follow x[i+1] = (5*x[i] + 3) mod vocab with 10% random tokens: learnable, seeded."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    seq = start.clone().expand(n, seq_len + 1).clone()
    for i in range(1, seq_len + 1):
        seq[:, i] = (5 * seq[:, i - 1] + 3) % vocab
    noise = torch.rand(n, seq_len + 1, generator=g) < 0.1
    return torch.where(noise, torch.randint(0, vocab, seq.shape, generator=g), seq)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, args: argparse.Namespace, step: int,
               ctx: npudist.DistContext,
               data_wait: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> torch.Tensor:
    """One optimizer step on this rank's share of the step's global batch; returns the loss. Building the
    batch runs under ``data_wait`` (the step timer's), so a rank slowed by its data is named as such."""
    per_rank = args.global_batch_size // ctx.world_size
    with data_wait():
        batch = global_batch(args.seed, step, args.global_batch_size, args.seq_len, args.vocab)
        mine = batch[ctx.rank * per_rank:(ctx.rank + 1) * per_rank].to(ctx.device)
    logits = model(mine[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, args.vocab), mine[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


class Position:
    """Where the run is, for the line Ctrl-C prints: rank 0 prints it (before init, RANK says who that is)."""

    def __init__(self) -> None:
        self.step = 0
        self.is_main = os.environ.get("RANK", "0") == "0"


def train(args: argparse.Namespace, at: Position) -> None:
    knobs.hold(args, int(os.environ.get("RANK", "0")), "init")  # testing: --hold-at init
    ctx = npudist.init(watch=False)  # the loop starts below, with this script's settings
    at.is_main = ctx.is_main
    if args.global_batch_size % ctx.world_size:
        raise SystemExit(f"--global-batch-size {args.global_batch_size} must divide by the world size "
                         f"{ctx.world_size}")
    torch.manual_seed(args.seed)  # identical initial weights on every rank (DDP also broadcasts them)
    model = TinyLM(args.vocab, args.d_model, args.layers, args.seq_len, args.activation).to(ctx.device)
    # Gradient buckets go through npudist.comm: adapted to the backend, numbered for hang diagnosis, counted.
    ddp = npudist.ddp(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    ckpt = checkpoint.LoopCheckpoints(args.run_dir, every=args.checkpoint_every, keep=args.keep,
                                      async_save=not args.sync_checkpoints, allow_simulated=args.resume_simulated)
    try:  # one job per run directory, then the freshest copy: a peer snapshot or the newest good checkpoint
        start = at.step = ckpt.resume(model, opt, ctx)
    except checkpoint.CheckpointError as exc:  # every rank reads the same lock and manifest: all stop here
        raise SystemExit(f"train_ddp.py: {exc}") from None
    if start >= args.steps and ctx.is_main:
        print(f"already at step {start} in {args.run_dir}: raise --steps (make demo STEPS=...) above {start} "
              f"or remove {args.run_dir}", flush=True)
    # Step times, skew windows, the rank's metrics (on NPUDIST_METRICS_PORT + local rank when set), the run
    # log `npudist report RUN_DIR` plots and rank 0's progress line: the optimizer's step marks each step.
    loop = npudist.loop(total_steps=args.steps, start_step=start, log_every=args.log_every,
                        samples_per_step=args.global_batch_size, run_dir=args.run_dir, resume_source=ckpt.source,
                        exchange_every=args.exchange_every, op_ranks=args.op_ranks,
                        straggler_diagnosis=args.straggler_diagnosis, telemetry=not args.no_telemetry)
    last = None
    with knobs.injected(args, ctx.rank, ddp, start):  # testing: faults, slow ranks (nothing without their flags)
        for step in range(start + 1, args.steps + 1):
            last = train_step(ddp, opt, args, step, ctx, loop.data_wait)
            at.step = step
            npudist.log(loss=last)  # read only when a progress line needs it
            ckpt.after_step(step, model, opt, last, last=step == args.steps)
    loss_value = float(last.detach()) if last is not None else ckpt.loss
    loop.flush()  # the last step's line
    if args.every_rank_done or ctx.is_main:
        print(f"rank={ctx.rank} done steps={args.steps}", flush=True)
    if ctx.is_main:
        print(f"final step={args.steps} loss={loss_value:.6f} params_sha256={checkpoint.state_sha256(model)}",
              flush=True)
    ckpt.wait()  # the summary names the checkpoints on disk
    loop.finish(checkpoints=bool(args.run_dir))  # rank 0's summary: stragglers, diagnoses, checkpoints


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    stop, at = Interrupt(), Position()
    try:
        train(args, at)
    except BaseException as exc:
        if not stop.caused(exc):
            raise
        if at.is_main:  # before the teardown, which may wait on peers that already left
            print(interrupted_line(at.step, checkpoint.describe_newest(args.run_dir)), flush=True)
        raise SystemExit(130) from None
    finally:
        # Ends what this rank started, in one order: run log, metrics server and poller, the last
        # background checkpoint write, the process group, then the run-directory lock.
        npudist.shutdown()


if __name__ == "__main__":
    main()
