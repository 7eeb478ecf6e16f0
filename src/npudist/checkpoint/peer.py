"""In-memory peer snapshots and the restart path that picks the freshest verified copy.

Every K steps a rank takes a consistent view of its state (peer_view.py): what a forward or the caller
may change is copied at the call (device state the way the async checkpoint's HostStaging copies it); the
host tensors an optimizer owns are copied on a stager thread into buffers reused from one snapshot to the
next, and every optimizer's next step waits for that copy (the step waits for a consistent view, not for
the send). The stager serialises (peer_pack.py) and hashes the copy, and the checkpoint writer's thread
sends it to the holder of its partner's node (peer_holder.py) and to its own node's. The partner is
``(rank + local_world_size) % world``: a rank of the next node, so one lost node never takes both a
rank and its copy; on a single node it is the rank itself and the copy sits in this node's holder,
which outlives torchrun's worker restarts.

On start, ``restore()`` agrees with every rank on the newest step all of them hold a verified copy of
(a MIN all-reduce per round, O(1) per rank), uses it when it is at least as new as the newest disk
checkpoint, and otherwise loads from disk. ``npudist launch --peer-snapshots K`` turns it on: it
starts this node's holder and tells the ranks through NPUDIST_PEER_HOLDER, NPUDIST_PEER_SNAPSHOT_EVERY and the
job's secret NPUDIST_PEER_SECRET (peer_auth.py), which signs every request to a holder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from npudist.checkpoint import peer_auth
from npudist.checkpoint.peer_holder import KEEP, request
from npudist.checkpoint.peer_pack import FlatCopy, pack, to_bytes, unpack
from npudist.checkpoint.peer_view import Path, at, owned_storages, walk
from npudist.checkpoint.staging import HostStaging, copy_host, on_device
from npudist.checkpoint.store import list_checkpoints, load_latest
from npudist.checkpoint.writer import CheckpointError, writer
from npudist.comm import control

log = logging.getLogger("npudist.checkpoint")

HOLDER_VAR = "NPUDIST_PEER_HOLDER"
"""host:port of this node's holder, set by `npudist launch --peer-snapshots`."""
EVERY_VAR = "NPUDIST_PEER_SNAPSHOT_EVERY"
"""Steps between in-memory peer snapshots, set by `npudist launch --peer-snapshots K`."""
SOURCES = ("peer-memory", "local-memory", "disk")


@dataclass
class PeerStats:
    snapshots: int = 0
    last_step: int = -1
    """Step of the newest copy the partner's holder accepted."""
    bytes: int = 0
    """Size of the newest copy sent."""
    blocking_seconds: float = 0.0
    """Total time snapshot() held the training loop (staging, and waiting for the previous send)."""
    failures: int = 0
    skipped: int = 0
    """Snapshots not taken because the previous copy was still being sent."""
    age_steps: int = 0
    """Steps the training loop ran since the newest copy the partner's holder accepted (all of them if none)."""
    recoveries: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    every: int = 0
    """Steps between snapshots (``--peer-snapshots K``): an age past 2K means two snapshots in a row missed."""


@dataclass(frozen=True)
class Restored:
    state: dict[str, Any]
    step: int
    source: str
    """One of SOURCES."""
    line: str
    """The one line that says which copy was used and why."""


class PeerSnapshots:
    """This rank's sender of peer snapshots; one per Runtime, closed with the checkpoint writer."""

    def __init__(self, every: int, local_holder: str, partner_holder: str, rank: int, world: int,
                 partner: int, *, secret: bytes) -> None:
        self.every, self.secret = every, secret
        self.local_holder, self.partner_holder = local_holder, partner_holder
        self.rank, self.world, self.partner = rank, world, partner
        self.stats = PeerStats()
        self._staging = HostStaging()
        self._owned_copy = FlatCopy()
        """The optimizers' tensors, copied on the stager thread into buffers reused while the layout holds."""
        self._plan: tuple[Path, ...] | None = None
        """Paths of the leaves the next call copies (peer_view.py); None until the first call's walk."""
        self._lock = threading.Lock()
        self._sent = threading.Event()
        """Set when no copy is in the pipeline (being serialised, waiting or being sent)."""
        self._sent.set()
        self._in_flight = 0
        self._free = threading.Event()
        """Set when the staging buffers may take the next copy (the previous one is serialised)."""
        self._free.set()
        self._waiting: tuple[int, str, bytes] | None = None
        self._viewed = threading.Event()
        """Clear while the copy of the optimizers' tensors is being made off the training loop."""
        self._viewed.set()
        self._step = self._start = 0
        self._optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        # A bare queue to the stager: submitting to an executor (a Future, its locks) cost the call ~40 µs.
        self._jobs: queue.SimpleQueue[tuple[Any, dict[Path, Any], int] | None] = queue.SimpleQueue()
        self._stager = threading.Thread(target=self._stage, name="npudist-peer-stage", daemon=True)
        self._stager.start()
        self._hook = register_optimizer_step_pre_hook(self._before_step)

    def due(self, step: int) -> bool:
        """Whether ``step`` is a snapshot step; called every step, it also keeps the copy's age in steps."""
        self._step = step
        return step % self.every == 0

    def snapshot_stats(self) -> PeerStats:
        with self._lock:
            s = self.stats
            base = s.last_step if s.last_step >= 0 else self._start
            return PeerStats(s.snapshots, s.last_step, s.bytes, s.blocking_seconds, s.failures, s.skipped,
                             max(0, self._step - base), dict(s.recoveries), every=self.every)

    def snapshot(self, state: Any, step: int) -> float:
        """Stage ``state`` now and send it to the partner's holder in the background; returns the seconds
        the caller was held. A failed send is logged and counted; training goes on (disk remains).

        What holds the loop: copying the leaves at the plan's paths (peer_view.py: buffers such as BatchNorm's,
        which a forward changes, device state into the reused host buffers), and, at the next optimizer step,
        any rest of the copy of the host tensors the optimizers own (_before_step). Walking the state, copying
        the optimizers' tensors, serialising and hashing run on the stager thread; sending on the writer's."""
        began = time.perf_counter()
        if not self._free.is_set():
            # The staging buffers are reused, so the previous copy must be serialised first; the loop never
            # waits for that, so this snapshot is skipped (the copy ages one interval) instead.
            with self._lock:
                self.stats.skipped += 1
            log.warning("peer snapshot of step %d skipped: the previous copy is still being serialised", step)
            return time.perf_counter() - began
        early = self._early(state)
        self._free.clear()
        self._busy(+1)
        self._viewed.clear()
        self._jobs.put((state, early, step))
        held = time.perf_counter() - began
        with self._lock:
            self.stats.blocking_seconds += held
        return held

    def _early(self, state: Any) -> dict[Path, Any]:
        """The copies made at the call, by path: the leaves at the plan's paths; the first time, and whenever
        the plan no longer fits the state, those the walk finds here."""
        plan, leaves = self._plan, None
        if plan is not None:
            try:
                leaves = [at(state, p) for p in plan]
            except (LookupError, TypeError):
                leaves = None
        if leaves is None:
            with self._lock:
                optimizers = list(self._optimizers)
            plan = walk(state, {}, owned_storages(optimizers)).plan
            leaves = [at(state, p) for p in plan]
        device = any(isinstance(t, torch.Tensor) and on_device(t) for t in leaves)
        return dict(zip(plan, self._staging.stage(leaves) if device else copy_host(leaves), strict=True))

    def _before_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """Runs before every optimizer's step (torch's global pre-hook): remembers the optimizer, and waits for
        the copy of the tensors the step is about to change; the wait counts as blocking time."""
        if optimizer not in self._optimizers:
            with self._lock:  # the stager lists them
                self._optimizers.add(optimizer)
        if not self._viewed.is_set():
            began = time.perf_counter()
            self._viewed.wait()
            with self._lock:
                self.stats.blocking_seconds += time.perf_counter() - began

    def _busy(self, delta: int) -> None:
        """Copies in the pipeline (being serialised, queued or being sent); ``_sent`` is set at none."""
        with self._lock:
            self._in_flight += delta
            if self._in_flight:
                self._sent.clear()
            else:
                self._sent.set()

    def _stage(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._serialise(*job)

    def _serialise(self, state: Any, early: dict[Path, Any], step: int) -> None:
        """On the stager thread: walk the state, copy what the optimizers own (then they may step),
        serialise, hash, and hand the bytes to the writer's thread; the staging buffers are free again from
        then on. A copy that missed a leaf the call should have copied (the state's layout changed since
        the plan was made) is dropped: it would not be the state of one step."""
        handed = False
        try:
            with self._lock:
                optimizers = list(self._optimizers)
            view = walk(state, early, owned_storages(optimizers))
            self._plan = view.plan
            if view.missed:
                self._viewed.set()
                with self._lock:
                    self.stats.skipped += 1
                log.warning("peer snapshot of step %d skipped: %s changed layout since the previous snapshot and "
                            "was not copied at the call; the next snapshot copies it", step,
                            ", ".join("/".join(map(str, p)) or "the state" for p in view.missed[:3]))
                return
            packed = pack(state, early, view.owned, self._owned_copy)
            self._viewed.set()
            del state, early
            payload = to_bytes(packed)
            del packed
            self._free.set()
            handed = self._queue(step, hashlib.sha256(payload).hexdigest(), payload)
        except Exception as exc:  # a lost copy costs recovery time, never the healthy job
            with self._lock:
                self.stats.failures += 1
            log.warning("peer snapshot of step %d not taken: %s: %s", step, type(exc).__name__, exc)
        finally:
            self._viewed.set()
            self._free.set()
            if not handed:
                self._busy(-1)

    def _queue(self, step: int, digest: str, payload: bytes) -> bool:
        """Hand a copy to the writer's thread; the newest waits there, one at most: a copy still waiting
        when a newer one comes is dropped (counted as skipped), so a slow holder never piles copies up.
        True when a new send job took over this copy's place in the pipeline count."""
        with self._lock:
            replaced = self._waiting is not None
            self._waiting = (step, digest, payload)
            if replaced:
                self.stats.skipped += 1
        if replaced:
            return False  # the send job already queued takes this newer copy instead
        try:
            writer().submit(self._send)
        except BaseException:
            with self._lock:
                self._waiting = None
            raise
        return True

    def _send(self) -> None:
        with self._lock:
            step, digest, payload = self._waiting
            self._waiting = None
        try:
            # The partner's node first (it survives this node), then this node's own holder, which keeps the
            # copy for this rank's restart when the partner's node is the one lost.
            for i, address in enumerate(dict.fromkeys([self.partner_holder, self.local_holder])):
                try:
                    self._put(address, step, digest, payload)
                except Exception as exc:  # a lost copy costs recovery time, never the healthy job
                    with self._lock:
                        self.stats.failures += 1
                    log.warning("peer snapshot of step %d to %s failed: %s: %s (the disk checkpoint is still the "
                                "fallback)", step, address, type(exc).__name__, exc)
                    continue
                if i == 0:
                    with self._lock:
                        self.stats.snapshots += 1
                        self.stats.last_step, self.stats.bytes = step, len(payload)
        finally:
            self._busy(-1)

    def _put(self, address: str, step: int, digest: str, payload: bytes) -> None:
        reply, _ = request(address, {"op": "put", "owner": self.rank, "world": self.world, "step": step,
                                     "sha256": digest}, payload, secret=self.secret)
        if not reply.get("ok"):
            raise CheckpointError(f"holder {address} refused step {step}: {reply.get('error')}")

    def close(self) -> None:
        self._viewed.wait()
        self._sent.wait()
        self._jobs.put(None)
        self._stager.join()
        self._hook.remove()
        self._staging.close()
        self._owned_copy.close()


def from_env(ctx_rank: int, world: int, local_world: int) -> PeerSnapshots | None:
    """The Runtime's PeerSnapshots when launch turned them on; every rank must call it (one store swap)."""
    holder, every = os.environ.get(HOLDER_VAR), os.environ.get(EVERY_VAR)
    if not holder or not every:
        return None
    try:
        secret = peer_auth.from_env()
    except peer_auth.PeerSecretError as exc:
        raise CheckpointError(f"{HOLDER_VAR} is set but {exc}") from None
    w = writer()
    if w.peer is None:
        partner = (ctx_rank + local_world) % world
        # Rank r sends to partner p's holder: p publishes its node's address, r reads it (O(1) per rank).
        # Only the address travels through the store: the secret comes from this rank's launcher.
        partner_holder = control.swap_text("peer-holder", holder, partner)
        w.peer = PeerSnapshots(int(every), holder, partner_holder, ctx_rank, world, partner, secret=secret)
    return w.peer


def restore(run_dir: str | os.PathLike | None, peer: PeerSnapshots | None, *,
            allow_simulated: bool = False) -> Restored | None:
    """The freshest copy every rank holds: an in-memory one at least as new as the newest disk checkpoint,
    else the newest good disk checkpoint; None when there is neither. Every rank must call it."""
    steps = list_checkpoints(run_dir) if run_dir else []
    disk_top = control.max_int(steps[0] if steps else -1)
    if peer is not None:
        found = _from_memory(peer, disk_top)
        if found is not None:
            peer.stats.recoveries[found.source] += 1
            peer._step = peer._start = found.step
            return found
    loaded = load_latest(run_dir, allow_simulated=allow_simulated) if run_dir else None
    if loaded is None:
        return None
    state, step = loaded
    why = "no in-memory copy held by every rank" if peer is not None else "peer snapshots are off"
    if peer is not None:
        peer.stats.recoveries["disk"] += 1
        peer._step = peer._start = step
    return Restored(state, step, "disk", f"resume: source=disk step={step} run_dir={run_dir} ({why})")


def _from_memory(peer: PeerSnapshots, disk_top: int) -> Restored | None:
    """Each rank's own copy at this world size (bitwise what the rank held: its shard, RNG, data position).
    Only when the world size changed, rank 0's copy of another world size, which is what a disk resume
    loads on every rank (plain state has one writer, rank 0), so an elastic job that lost a node resumes
    from memory at its new world size. At an unchanged size, rank 0's copy would silently replace every
    other rank's own state, so a rank without its own copy resumes from disk with the others."""
    return _agree(peer, disk_top, peer.rank, peer.world) or _agree(peer, disk_top, 0, None, not_world=peer.world)


def _agree(peer: PeerSnapshots, disk_top: int, owner: int, world: int | None,
           not_world: int | None = None) -> Restored | None:
    held: dict[int, tuple[str, str, int]] = {}
    for address in dict.fromkeys([peer.partner_holder, peer.local_holder]):  # the partner's first
        try:
            reply, _ = request(address, {"op": "list", "owner": owner, "world": world}, secret=peer.secret,
                               timeout=30)
        except OSError as exc:
            log.warning("peer snapshot holder %s unreachable: %s", address, exc)
            continue
        for step, sha, of_world in reply.get("copies", []):
            if int(of_world) != not_world:
                held.setdefault(int(step), (address, str(sha), int(of_world)))
    cap = None
    for _ in range(KEEP + 1):
        mine = max((s for s in held if cap is None or s < cap), default=-1)
        step = control.min_int(mine)
        if step < 0 or step < disk_top:
            return None
        state, why = _fetch(held.get(step), owner, step, peer.secret)
        if not control.any_rank(state is None):
            address, _, of_world = held[step]
            source = "peer-memory" if address != peer.local_holder else "local-memory"
            whose = "" if owner == peer.rank and of_world == peer.world else \
                f"rank {owner}'s copy at world {of_world}, now {peer.world}; "
            return Restored(state, step, source, f"resume: source={source} step={step} holder={address} "
                                                 f"({whose}sha256 verified; newest disk checkpoint: "
                                                 f"{disk_top if disk_top >= 0 else 'none'})")
        if state is None:
            log.warning("rank %d: in-memory copy of step %d refused: %s", peer.rank, step, why)
        cap = step
    return None


def _fetch(where: tuple[str, str, int] | None, owner: int, step: int, secret: bytes) -> tuple[Any, str]:
    if where is None:
        return None, "no copy of that step"
    address, listed, world = where
    try:
        reply, payload = request(address, {"op": "get", "owner": owner, "world": world, "step": step},
                                 secret=secret)
    except OSError as exc:
        return None, f"holder {address} unreachable ({exc})"
    if not reply.get("ok"):
        return None, str(reply.get("error"))
    actual = hashlib.sha256(payload).hexdigest()
    if actual != listed:
        return None, f"checksum mismatch: sha256 {actual[:12]} != recorded {listed[:12]} (holder {address})"
    try:
        return unpack(payload), ""
    except Exception as exc:
        return None, f"verified but did not load ({type(exc).__name__}: {exc})"


__all__ = ["EVERY_VAR", "HOLDER_VAR", "PeerSnapshots", "PeerStats", "Restored", "from_env", "restore"]
