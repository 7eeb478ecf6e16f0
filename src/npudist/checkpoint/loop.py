"""A training loop's checkpoints in one object: the run directory claimed, the freshest copy loaded on
start, a checkpoint and a peer snapshot taken when due.

Every DDP loop that wants a killed and restarted job to end where an uninterrupted one does needs the same
calls around npudist.checkpoint (examples/train_ddp.py made them inline): ``lock_run_dir`` (one job per run
directory), ``peer_snapshots`` (in-memory copies under ``npudist launch --peer-snapshots K``), ``restore``
(the newest copy every rank holds), ``save`` every N steps and at the end. What a copy holds is what a
resume must restore for a bit-for-bit continuation: the model, the optimizer, torch's RNG state, the step
and its loss. The data order is the script's: a resumed script must see the batches an uninterrupted one
would from ``resume()``'s step on (a batch that is a function of the step does).
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any

import torch

from npudist.checkpoint.lock import lock_run_dir
from npudist.checkpoint.peer import PeerSnapshots, from_env, restore
from npudist.checkpoint.store import list_checkpoints, save
from npudist.checkpoint.writer import SaveHandle


class LoopCheckpoints:
    """Checkpoints of one training loop in ``run_dir`` (None: no checkpoints; peer snapshots still go out
    when launch turned them on). ``every``: steps between checkpoints; ``keep``: how many stay;
    ``async_save``: written in the background (``save(async_save=True)``); ``allow_simulated``: resume from
    a checkpoint a simulated-NPU run wrote (provenance.py refuses it on a real device otherwise)."""

    def __init__(self, run_dir: str | os.PathLike | None, *, every: int = 20, keep: int = 3,
                 async_save: bool = True, allow_simulated: bool = False) -> None:
        if every < 1 or keep < 1:
            raise ValueError(f"LoopCheckpoints: every and keep must be at least 1, got every={every} keep={keep}")
        self.run_dir = str(run_dir) if run_dir is not None else None
        self.every, self.keep, self.async_save, self.allow_simulated = every, keep, async_save, allow_simulated
        self.peer: PeerSnapshots | None = None
        self.loss = math.nan
        """The loss of the step resumed from (nan when starting fresh), then of the last step saved."""
        self.source: str | None = None
        """Where the resumed state came from (peer.SOURCES), None when starting fresh."""
        self._saved: SaveHandle | os.PathLike | None = None

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: Any) -> int:
        """Claim the run directory, then load the freshest copy into ``model``, ``optimizer`` and torch's RNG;
        return its step (0 when there is none). Every rank calls it once, after ``npudist.init()`` (it makes
        collective calls); ``ctx`` is the DistContext. Rank 0 prints where the state came from. Raises
        CheckpointError (RunDirBusy for a directory another live job holds) on every rank alike."""
        if self.run_dir:
            lock_run_dir(self.run_dir)  # held until npudist.shutdown()
        self.peer = from_env(ctx.rank, ctx.world_size, ctx.local_world_size)
        found = restore(self.run_dir, self.peer, allow_simulated=self.allow_simulated)
        if found is None:
            return 0
        model.load_state_dict(found.state["model"])
        optimizer.load_state_dict(found.state["optim"])
        torch.set_rng_state(found.state["rng"])
        self.loss, self.source = float(found.state["loss"]), found.source
        if ctx.is_main:
            print(f"resumed from step={found.step} run_dir={self.run_dir}", flush=True)
            print(found.line, flush=True)
        return found.step

    def after_step(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   loss: torch.Tensor | float, *, last: bool = False) -> None:
        """Call after each optimizer step: a peer snapshot when one is due, a checkpoint every ``every``
        steps and at the ``last`` step. The state is built only when something is due."""
        snapshot = self.peer is not None and self.peer.due(step)  # due() also ages the copy: every step
        saving = self.run_dir is not None and (step % self.every == 0 or last)
        if not (snapshot or saving):
            return
        state = {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": step,
                 "loss": float(loss.detach() if isinstance(loss, torch.Tensor) else loss),
                 "rng": torch.get_rng_state()}
        if snapshot:
            self.peer.snapshot(state, step)  # type: ignore[union-attr]
        if saving:
            self.loss = state["loss"]
            self._saved = save(state, self.run_dir, step, keep=self.keep,  # type: ignore[arg-type]
                               async_save=self.async_save)

    def wait(self) -> None:
        """Wait for the last background write (raises its CheckpointError), so what follows sees it on disk."""
        if isinstance(self._saved, SaveHandle):
            self._saved.wait()


def describe_newest(run_dir: str | os.PathLike | None) -> str:
    """The newest checkpoint in ``run_dir`` as a line names it: ``step N in DIR``, or ``none``."""
    steps = list_checkpoints(run_dir) if run_dir else []
    return f"step {max(steps)} in {run_dir}" if steps else "none"


def state_sha256(module: torch.nn.Module) -> str:
    """sha256 over ``module``'s state_dict (names and raw bytes, in name order): two runs that end with the
    same hex digest hold bit-identical weights, which is how a resumed run is checked against an
    uninterrupted one."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        # The tensor's bytes without numpy: torch < 2.3 cannot load numpy 2, which pip installs by default.
        h.update(bytes(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).tolist()))
    return h.hexdigest()
