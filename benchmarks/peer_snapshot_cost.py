"""What an in-memory peer snapshot costs the training loop, and how fast a restart reads it back.

One process, the example's model (examples/train_ddp.py's TinyLM, AdamW), this node's holder served by
a process of its own, as `npudist launch --peer-snapshots` serves it from the launcher's process
(``--holder-in-process``: from a thread of this one, as the figures before 2026-12-06 were taken). Blocks
of steps with and without a snapshot every step, interleaved so both see the same machine; then the time
to restore from the holder and from the disk checkpoint of the same state. Prints one line
`RESULT {json}` (ratios against the same run).

    python benchmarks/peer_snapshot_cost.py [--d-model 256 --layers 4 --rounds 3 --steps 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from train_ddp import TinyLM, global_batch

import npudist
from npudist.checkpoint import load_latest, save
from npudist.checkpoint import peer as peer_mod
from npudist.checkpoint.peer_holder import serving
from npudist.checkpoint.writer import writer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--holder-in-process", action="store_true", help="serve the holder from a thread of this process")
    args = p.parse_args()
    torch.manual_seed(0)
    vocab, seq = 64, 32
    model = TinyLM(vocab, args.d_model, args.layers, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(i: int) -> torch.Tensor:
        batch = global_batch(0, i, 16, seq, vocab)
        loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def state(i: int, loss: torch.Tensor) -> dict:
        return {"model": model.state_dict(), "optim": opt.state_dict(), "step": i, "loss": float(loss.detach()),
                "rng": torch.get_rng_state()}

    plain, held, snapped, built, i = [], [], [], [], 0
    secret = secrets.token_bytes(32)
    with _holder(secret, args.holder_in_process) as address, tempfile.TemporaryDirectory() as tmp:
        sender = peer_mod.PeerSnapshots(1, address, address, rank=0, world=1, partner=0,
                                        secret=secret)
        writer().peer = sender
        for r in range(args.rounds):
            for mode in (("plain", "snap") if r % 2 == 0 else ("snap", "plain")):
                for _ in range(args.steps):
                    i += 1
                    blocked = sender.stats.blocking_seconds
                    began = time.perf_counter()
                    loss = step(i)  # its optimizer step waits for the previous snapshot's copy, if still made
                    took = time.perf_counter() - began
                    if mode == "snap":
                        made = time.perf_counter()
                        st = state(i, loss)
                        built.append(time.perf_counter() - made)
                        sender.snapshot(st, i)
                        # What held the loop this step: snapshot() and any wait in the optimizer's step.
                        held.append(sender.stats.blocking_seconds - blocked)
                        snapped.append(time.perf_counter() - began)  # the whole step, snapshot included
                    plain.append(took) if mode == "plain" else None
        sender.snapshot(state(i, loss), i)  # the same step in memory and on disk: restore reads memory
        sender._sent.wait()
        save(state(i, loss), tmp, i)
        began = time.perf_counter()
        mem = peer_mod.restore(tmp, sender)
        memory_s = time.perf_counter() - began
        began = time.perf_counter()
        load_latest(tmp)
        disk_s = time.perf_counter() - began
        nbytes = sender.stats.bytes
        # A snapshot due while the previous copy is still being sent is skipped (counted), not waited for.
    npudist.shutdown()
    step_s = statistics.median(plain)
    print("RESULT " + json.dumps({
        "step_seconds_median": step_s, "snapshot_blocking_seconds_median": statistics.median(held),
        "blocking_over_step_ratio": statistics.median(held) / step_s,
        # The caller's model.state_dict() and optimizer.state_dict(), which the example's loop pays too.
        "state_build_seconds_median": statistics.median(built),
        # Against the same run without snapshots: also what the stager's copy, serialisation and hashing
        # take from the training thread's CPU (one core each here).
        "step_with_snapshot_seconds_median": statistics.median(snapped),
        "step_slowdown_ratio": statistics.median(snapped) / step_s - 1, "copy_bytes": nbytes,
        "snapshots_skipped": sender.stats.skipped,
        "restore_from_memory_seconds": memory_s, "restore_from_disk_seconds": disk_s,
        "restored_source": mem.source, "d_model": args.d_model, "layers": args.layers,
        "holder": "thread" if args.holder_in_process else "process"}), flush=True)


def _serve(secret: bytes, conn: Connection) -> None:
    with serving("127.0.0.1", secret=secret) as server:
        conn.send(server.address)
        conn.recv()  # until the benchmark is done


@contextlib.contextmanager
def _holder(secret: bytes, in_process: bool) -> Iterator[str]:
    """The holder's address: served from a thread here, or from a process of its own (as launch serves it)."""
    if in_process:
        with serving("127.0.0.1", secret=secret) as server:
            yield server.address
        return
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(secret, there), daemon=True)
    proc.start()
    try:
        if not here.poll(120):
            raise RuntimeError("the holder process did not start within 120 s")
        yield here.recv()
    finally:
        here.send("stop")
        proc.join(30)


if __name__ == "__main__":
    main()
