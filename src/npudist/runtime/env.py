"""Where this process's rank comes from (torchrun, Open MPI, MPICH/Intel MPI or Slurm variables), and the
rest of what the launcher told it (torchrun's rendezvous address, torchelastic's TORCHELASTIC_* variables).

Pure functions over a mapping, so every launcher's environment can be tested without starting it: npudist
reads these variables here and nowhere else (``rank_info``, ``launcher_env``), from ``os.environ`` at the edge.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    source: str
    """Which launcher set the variables: torchrun, openmpi, mpich, slurm or single."""

    @property
    def needs_rendezvous_address(self) -> bool:
        """torchrun hands over its own store address; every other launcher needs MASTER_ADDR/PORT."""
        return self.source not in ("torchrun", "single") and self.world_size > 1


@dataclass(frozen=True)
class _Source:
    name: str
    rank: str
    world_size: str
    local_rank: str
    local_world_size: tuple[str, ...]
    node_rank: tuple[str, ...]


# First row whose rank and world-size variables are both set wins: torchrun beats MPI beats Slurm,
# because `srun mpirun` and `mpirun torchrun` nest and the innermost launcher is the one that counts.
_SOURCES: tuple[_Source, ...] = (
    _Source("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", ("LOCAL_WORLD_SIZE",), ("GROUP_RANK", "NODE_RANK")),
    _Source("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
            ("OMPI_COMM_WORLD_LOCAL_SIZE",), ()),
    _Source("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", ("MPI_LOCALNRANKS",), ()),
    _Source("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
            ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"), ("SLURM_NODEID",)),
)


class EnvError(ValueError):
    """A launcher variable holds something that is not a rank layout."""


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    # Slurm writes per-node counts as "4(x2),3"; the first count is this layout's per-node size.
    match = re.match(r"\s*(\d+)", raw)
    if not match:
        raise EnvError(f"{name}={raw!r} is not an integer; unset it or fix the launcher that set it")
    return int(match.group(1))


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        if env.get(name, "").strip():
            return _int(env, name)
    return None


def rank_info(env: Mapping[str, str]) -> RankInfo:
    """Rank layout from launcher variables; a process with none of them is a world of one."""
    for src in _SOURCES:
        if not (env.get(src.rank, "").strip() and env.get(src.world_size, "").strip()):
            continue
        rank, world = _int(env, src.rank), _int(env, src.world_size)
        local_rank = _int(env, src.local_rank) if env.get(src.local_rank, "").strip() else 0
        local_world = _first(env, src.local_world_size) or (world if src.name != "torchrun" else 1)
        node_rank = _first(env, src.node_rank)
        if node_rank is None:
            node_rank = rank // local_world if local_world else 0
        info = RankInfo(rank, world, local_rank, local_world, node_rank, src.name)
        _validate(info, src)
        return info
    return RankInfo(0, 1, 0, 1, 0, "single")


def _validate(info: RankInfo, src: _Source) -> None:
    if info.world_size < 1:
        raise EnvError(f"{src.world_size}={info.world_size}: the world size must be at least 1")
    if not 0 <= info.rank < info.world_size:
        raise EnvError(f"{src.rank}={info.rank} is outside 0..{info.world_size - 1} ({src.world_size})")
    if not 0 <= info.local_rank < max(info.local_world_size, 1):
        raise EnvError(
            f"{src.local_rank}={info.local_rank} is outside 0..{info.local_world_size - 1} (local world size)"
        )


def torchrun_env(info: RankInfo, master_addr: str, master_port: int) -> dict[str, str]:
    """The variables torchrun would have set for this rank, so a script run under MPI sees the same."""
    return {
        "RANK": str(info.rank),
        "WORLD_SIZE": str(info.world_size),
        "LOCAL_RANK": str(info.local_rank),
        "LOCAL_WORLD_SIZE": str(info.local_world_size),
        "GROUP_RANK": str(info.node_rank),
        "NODE_RANK": str(info.node_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


@dataclass(frozen=True)
class LauncherEnv:
    """What torchrun's elastic agent (or ``npudist launch --mpi``) tells a worker besides its rank layout.

    Names follow torch's ``torch/distributed/elastic/agent/server/local_elastic_agent.py``, which sets them.
    """

    master_addr: str = ""
    """MASTER_ADDR, stripped; "" when unset."""
    master_port: str = ""
    """MASTER_PORT as given, stripped; "" when unset (its checks belong to whoever connects to it)."""
    local_rank: int | None = None
    """LOCAL_RANK; None when unset or not an integer."""
    local_world_size: int | None = None
    """LOCAL_WORLD_SIZE; None when unset or not an integer."""
    run_id: str = ""
    """TORCHELASTIC_RUN_ID; "" when unset or torchrun's static rendezvous placeholder "none"."""
    restart_count: int = 0
    """TORCHELASTIC_RESTART_COUNT: 0 in the first attempt (and when unset or not an integer)."""
    max_restarts: int | None = None
    """TORCHELASTIC_MAX_RESTARTS; None when unset (not under torchrun)."""
    error_file: str = ""
    """TORCHELASTIC_ERROR_FILE: where torchrun reads a failed worker's error; "" when unset."""
    use_agent_store: bool = False
    """TORCHELASTIC_USE_AGENT_STORE == "True": the agent's TCPStore is at MASTER_ADDR:MASTER_PORT."""

    def address(self, default: str = "?") -> str:
        """``MASTER_ADDR:MASTER_PORT`` for messages, ``default`` for each part that is unset."""
        return f"{self.master_addr or default}:{self.master_port or default}"


def _int_or_none(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    return int(raw) if raw.isdigit() else None


def launcher_env(env: Mapping[str, str]) -> LauncherEnv:
    """The launcher's variables in ``env`` (``os.environ`` in a worker) as one record."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    return LauncherEnv(
        master_addr=env.get("MASTER_ADDR", "").strip(),
        master_port=env.get("MASTER_PORT", "").strip(),
        local_rank=_int_or_none(env, "LOCAL_RANK"),
        local_world_size=_int_or_none(env, "LOCAL_WORLD_SIZE"),
        run_id="" if run_id == "none" else run_id,
        restart_count=_int_or_none(env, "TORCHELASTIC_RESTART_COUNT") or 0,
        max_restarts=_int_or_none(env, "TORCHELASTIC_MAX_RESTARTS"),
        error_file=env.get("TORCHELASTIC_ERROR_FILE", "").strip(),
        use_agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )
