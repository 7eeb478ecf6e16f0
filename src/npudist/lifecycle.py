"""init()/shutdown(): pick the device first, then the backend, then join the process group.

init() starts (or reuses) this process's Runtime, records the joined group in it as a DistContext and
gives it the group to end; shutdown() closes that Runtime. This module sits above the accelerators, comm,
checkpoint and telemetry (it starts and ends what they own); ``npudist.runtime`` below them all only
holds the state.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from npudist.accelerators import Accelerator, accelerator
from npudist.comm import control
from npudist.comm import state as comm_state
from npudist.runtime import network
from npudist.runtime.env import LauncherEnv, RankInfo, launcher_env, rank_info
from npudist.runtime.settings import Settings, SettingsError
from npudist.runtime.state import Runtime, current, peek

DEFAULT_TIMEOUT_S = 600.0


class DistInitError(RuntimeError):
    """Joining the process group failed; the message says what to check."""


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: torch.device
    backend: str
    accelerator: Accelerator
    source: str
    timeout: timedelta

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _timeout(value: float | timedelta | None, settings: Settings) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if value is None:
        value = settings.timeout_s or DEFAULT_TIMEOUT_S
    if value <= 0:
        raise DistInitError(f"timeout must be positive, got {value} s")
    return timedelta(seconds=value)


def _rendezvous_address(info: RankInfo, launcher: LauncherEnv) -> tuple[str, int]:
    addr = launcher.master_addr
    if not addr:
        raise DistInitError(
            f"MASTER_ADDR is not set, and {info.source} does not provide a rendezvous address. "
            "Set MASTER_ADDR to the host of rank 0 (MASTER_ADDR=127.0.0.1 on a single machine) and "
            "MASTER_PORT to a free port, e.g. `mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500 ...`, "
            "or start the job with `npudist launch --mpi`, which sets both."
        )
    raw_port = launcher.master_port or "29500"
    if not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
        raise DistInitError(f"MASTER_PORT={raw_port!r} is not a TCP port (1-65535)")
    return addr, int(raw_port)


def _explain(exc: Exception, info: RankInfo, where: str, timeout: timedelta) -> DistInitError:
    text = str(exc)
    if "address already in use" in text.lower() or "EADDRINUSE" in text:
        return DistInitError(
            f"rank {info.rank}: the rendezvous port at {where} is already in use (another job or a stale "
            "rank holds it). Pick a free port (MASTER_PORT / --master-port) or stop the process holding it "
            f"(`ss -ltnp | grep {where.rsplit(':', 1)[-1]}`). Original error: {text}"
        )
    if "connection refused" in text.lower():
        return _refused(text, info, where)
    if "timed out" in text.lower() or "timeout" in text.lower():
        joined = re.search(r"(\d+)/(\d+) clients joined", text)
        seen = f" ({joined.group(1)} of {joined.group(2)} ranks joined)" if joined else ""
        return DistInitError(
            f"rank {info.rank} of {info.world_size}: rendezvous at {where} timed out after "
            f"{timeout.total_seconds():.0f} s{seen}. Check that all {info.world_size} ranks were started, "
            f"that the host of rank 0 ({where}) is reachable from this host on that port, and that every "
            f"rank uses the same MASTER_ADDR/MASTER_PORT. Original error: {text}"
        )
    return DistInitError(f"rank {info.rank}: init_process_group failed at {where}: {text}")


_REMOTE = re.compile(r"remote=\[?([^\]\s]+?)\]?:(\d+)")


def _refused(text: str, info: RankInfo, where: str) -> DistInitError:
    """A peer's published address refused us: either it advertised loopback (wrong interface) or the rank
    behind that address is gone."""
    m = _REMOTE.search(text)
    peer = f"{m.group(1)}:{m.group(2)}" if m else "its published address"
    master = where.rsplit(":", 1)[0]
    # Only a job spread over several nodes can be sent to the wrong host by a loopback address: on one node
    # every rank's loopback is the same, so a refusal there means the rank behind it is gone.
    several_nodes = info.world_size > info.local_world_size
    if m and several_nodes and network.is_loopback(m.group(1)) and not network.is_loopback(master):
        return DistInitError(
            f"rank {info.rank} of {info.world_size}: a peer advertised {peer}, a loopback address, so the "
            f"connection went to this host instead of the peer: a wrong-interface case, not a dead rank. Set "
            f"GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME, HCCL_IF_IP) on every node to the interface that routes to "
            f"{master} (`ip route get {master}`), or start with `npudist launch`, which sets it. "
            f"Original error: {text}"
        )
    return DistInitError(
        f"rank {info.rank} of {info.world_size}: a peer refused the connection at {peer} while joining at "
        f"{where}: the rank behind that address died or was restarted after publishing it. Check the other "
        f"ranks' logs; under torchrun, restarts get fresh addresses on the next attempt. Original error: {text}"
    )


def _check_advertised(info: RankInfo, launcher: LauncherEnv, backend: str) -> None:
    """Refuse, before any collective, a multi-node gloo rank that would advertise a loopback address: its
    peers on other nodes would connect to themselves and fail with "Connection refused" far from the cause."""
    master = launcher.master_addr
    if backend != "gloo" or info.world_size <= info.local_world_size or not master:
        return
    try:
        if network.is_loopback(network.resolve(master)):
            return  # every "node" on this host: loopback is what they share
        address, why = network.gloo_address(os.environ)
    except network.NetworkError:
        return
    if address and not network.is_loopback(address):
        return
    try:
        iface = network.route_to(master)
        use = f"{iface.name} ({iface.address}), the interface that routes to {master}"
        fix = f"export GLOO_SOCKET_IFNAME={iface.name}"
    except network.NetworkError:
        use, fix = f"the interface that routes to {master} (`ip route get {master}`)", "export GLOO_SOCKET_IFNAME=IFACE"
    raise DistInitError(
        f"rank {info.rank} of {info.world_size} (node {info.node_rank}) would advertise {address or 'no address'} "
        f"({why}) to ranks on other nodes, which cannot reach it. Use {use}: {fix} on every node, or start with "
        "`npudist launch`, which sets it."
    )


def init(backend: str | None = None, timeout: float | timedelta | None = None, *,
         watch: bool | None = None) -> DistContext:
    """Join (or return the already joined) process group for this rank.

    The device is selected before the group is created because HCCL and NCCL bind the communicator
    to the current device at creation; the backend is always passed explicitly so torch never guesses.
    ``watch``: start the watched loop (npudist.training: step times, rank metrics, run log, rank 0's
    progress line) now; None (default) starts it when the launch asked for metrics or a run directory
    (``npudist launch --metrics-port/--run-dir``), False leaves it to ``npudist.loop()``.
    """
    try:
        rt = current()
    except SettingsError as exc:
        raise DistInitError(str(exc)) from None
    if rt.context is not None and dist.is_initialized():
        return rt.context
    info = rank_info(os.environ)
    acc = accelerator()
    try:
        index = acc.device_index(info.local_rank, info.local_world_size)
    except ValueError as exc:
        raise DistInitError(str(exc)) from None
    acc.set_device(index)
    device = acc.device(index)
    chosen = backend or acc.backend
    td = _timeout(timeout, rt.settings)
    if not dist.is_initialized():
        _join(info, launcher_env(os.environ), chosen, td)
    if not rt.owns("group"):
        rt.own("group", control.end_group)
    rt.context = DistContext(
        rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=info.local_rank,
        local_world_size=info.local_world_size, node_rank=info.node_rank, device=device,
        backend=str(dist.get_backend()), accelerator=acc, source=info.source, timeout=td,
    )
    # The hang watchdog runs from here on, not from the first collective: a rank that loads or compiles
    # for long before it must be able to say that it is alive and busy.
    comm_state.start_watchdog()
    from npudist import training  # after the group: the loop's exporter reads the rank it joined as

    training.attach(rt, rt.context, watch)
    from npudist.checkpoint import peer_unused

    peer_unused.start(rt.context.rank)  # under `launch --peer-snapshots K`: says so if no copy is ever sent
    if rt.settings.dry_run_steps:
        _dry_run(rt)
    return rt.context


def _dry_run(rt: Runtime) -> None:
    """`npudist launch --dry-run[=N]`: end the script after N optimizer steps and a checkpoint round trip."""
    from npudist.training import dry_run

    steps, ctx = rt.settings.dry_run_steps, rt.context
    assert steps is not None and ctx is not None
    rt.own("run_logs", dry_run.install(steps, dry_run.checkpoint_dir(rt.settings.run_dir, os.environ), ctx.rank))


def _join(info: RankInfo, launcher: LauncherEnv, backend: str, timeout: timedelta) -> None:
    _check_advertised(info, launcher, backend)
    if info.source == "single":
        # A world of one needs no port: an in-process store keeps notebooks and tests free of clashes.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return
    if info.needs_rendezvous_address:
        addr, port = _rendezvous_address(info, launcher)
        where = f"{addr}:{port}"
        kwargs = {"init_method": f"tcp://{addr}:{port}", "rank": info.rank, "world_size": info.world_size}
    elif launcher.use_agent_store:
        where = launcher.address()
        kwargs = {"store": _attempt_store(info, launcher, timeout), "rank": info.rank, "world_size": info.world_size}
    else:
        where = launcher.address()
        kwargs = {"init_method": "env://"}
    try:
        if "store" in kwargs:
            _all_arrived(kwargs["store"], info.world_size, timeout)
        dist.init_process_group(backend, timeout=timeout, **kwargs)
    except (RuntimeError, ValueError, OSError) as exc:
        raise _explain(exc, info, where, timeout) from exc


ARRIVAL_POLL_S = 2.0
"""Longest pause between two looks for the missing ranks (each look is one non-blocking store request)."""


def _all_arrived(store: dist.Store, world_size: int, timeout: timedelta) -> None:
    """Wait, in Python, until every rank has reached init().

    Rule: a rank must stay interruptible (Ctrl-C, SIGTERM) while late peers load or compile, and
    init_process_group waits for them inside C++, where Python's signal handlers cannot run. All ranks are
    present once this returns, so what init_process_group then waits for is short. One counter per restart
    attempt (the store is prefixed by _attempt_store), read with ``add(key, 0)``, which does not block (so
    no timed-out wait is logged) and exists on every supported torch (``Store.check`` does not on 2.1).
    """
    store.add("arrived", 1)
    deadline = time.monotonic() + timeout.total_seconds()
    pause = 0.01
    while int(store.add("arrived", 0)) < world_size:
        if time.monotonic() >= deadline:
            raise RuntimeError(f"ranks still missing after {timeout.total_seconds():.0f} s "
                               f"({int(store.add('arrived', 0))} of {world_size} arrived)")
        time.sleep(pause)
        pause = min(ARRIVAL_POLL_S, pause * 2)


def _attempt_store(info: RankInfo, launcher: LauncherEnv, timeout: timedelta) -> dist.Store:
    """The agent's store, with this restart attempt's own key space.

    torchrun's static rendezvous keeps one TCPStore across restarts while env:// assumes a new one
    per attempt, so after a restart gloo can read the dead workers' addresses ("Connection refused",
    or a hang until the timeout). Prefixing the keys with the restart count gives every attempt
    fresh ones.
    """
    try:
        if not (launcher.master_addr and launcher.master_port.isdigit()):
            raise ValueError(f"MASTER_ADDR:MASTER_PORT is {launcher.address('unset')}")
        store = dist.TCPStore(launcher.master_addr, int(launcher.master_port), info.world_size, is_master=False,
                              timeout=timeout)
    except (ValueError, RuntimeError) as exc:
        raise DistInitError(f"rank {info.rank}: cannot reach torchrun's store at MASTER_ADDR/MASTER_PORT: {exc}") \
            from exc
    return dist.PrefixStore(f"npudist/attempt_{launcher.restart_count}", store)


def context() -> DistContext | None:
    """The context of the last init(), or None before init() or after shutdown()."""
    rt = peek()
    if rt is None or rt.context is None:
        return None
    return rt.context if dist.is_available() and dist.is_initialized() else None


def shutdown() -> None:
    """Close this process's Runtime (Runtime.close, in runtime.state.CLOSE_ORDER: run logs, metrics
    servers and pollers, the last checkpoint write, comm, the process group, the run-directory lock); safe
    to call twice, or without init() after a plain ``init_process_group``, whose group it ends too. A
    background checkpoint failure not raised yet is raised here, after the teardown (CheckpointError)."""
    rt = peek()
    if rt is None:
        control.end_group()
        return
    if not rt.owns("group"):
        rt.own("group", control.end_group)
    rt.close()
