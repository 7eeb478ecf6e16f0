"""`npudist launch`'s plan: what to run, from the command line and the environment, without running it.

torchrun's own parser and elastic agent do the work; the plan only fills in what torchrun cannot know (how
many devices this accelerator has, a free port on a single node, the simulated NPU, the metrics ports, the
peer holder's address) and maps MPI variables. runner.py carries it out.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from npudist.accelerators import Accelerator
from npudist.launch import multinode
from npudist.launch.devices import check_devices, resolve_nproc
from npudist.launch.errors import LaunchError
from npudist.launch.errors import settings as _settings
from npudist.launch.options import USAGE, parser
from npudist.launch.ports import free_port, port_in_use
from npudist.runtime import network
from npudist.runtime.env import rank_info, torchrun_env
from npudist.runtime.network import Interface
from npudist.runtime.settings import (
    ACCELERATOR_VAR,
    DRY_RUN_VAR,
    PORT_VAR,
    PROFILE_VAR,
    RUN_DIR_VAR,
    RUN_ID_SOURCES,
    RUN_ID_VAR,
    SIMULATE_MODES,
    SIMULATE_VAR,
    TENSORBOARD_VAR,
)
from npudist.telemetry.exposition.run_label import new_run_id


@dataclass
class LaunchPlan:
    mode: str
    """"torchrun" (the elastic agent starts the ranks) or "mpi" (this process is one rank)."""
    torchrun_argv: list[str] = field(default_factory=list)
    exec_argv: list[str] = field(default_factory=list)
    exec_env: dict[str, str] = field(default_factory=dict)
    nproc_per_node: int | None = None
    env_updates: dict[str, str] = field(default_factory=dict)
    """Variables the ranks get on top of this process's environment (NPUDIST_METRICS_PORT)."""
    targets_file: str | None = None
    targets: list[dict[str, object]] = field(default_factory=list)
    """Prometheus file_sd groups for the ranks started here, written to targets_file before they start."""
    script: str | None = None
    """The training script's path, checked before anything starts (None for -m MODULE and --no-python)."""
    notes: list[str] = field(default_factory=list)
    """What launch chose for the user and why, printed once to stderr before the ranks start."""
    peer_snapshots: int | None = None
    """Steps between in-memory peer snapshots (--peer-snapshots); this process then serves the node's holder."""
    peer_bind: str = "127.0.0.1"
    """The address this node's holder binds and advertises: on several nodes, the one that routes to the master."""
    multi_node: bool = False
    """Over several nodes: the holder's secret must then be one every node's launch shares (peer_auth.py)."""


_OURS = MappingProxyType({"--mpi": 0, "--dry-run": 0, "--metrics-port": 1, "--run-dir": 1, "--targets-file": 1,
                          "--simulate": 1, "--accelerator": 1, "--peer-snapshots": 1, "--peer-snapshot-bind": 1,
                          "--tensorboard": 1})


def accelerator_for(argv: Sequence[str]) -> Accelerator:
    """The accelerator --accelerator names, else the detected one (or NPUDIST_ACCELERATOR's)."""
    from npudist.accelerators import accelerator, get

    ns, _, _ = _split(argv)
    return get(ns.accelerator) if ns.accelerator else accelerator()


def _option_given(tokens: Sequence[str], names: Sequence[str]) -> bool:
    return any(t in names or any(t.startswith(n + "=") for n in names) for t in tokens)


def _refuse(message: str):
    raise LaunchError(f"{message} (usage: {USAGE}; see --help)")


def _split(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str], list[str]]:
    p = parser()
    p.error = _refuse  # argparse would print and sys.exit; callers get a LaunchError instead
    argv = _dry_run_tokens(p, list(argv))
    ns = p.parse_args(argv)
    tail = len(ns.training_script_args) + 1
    return ns, list(argv[: len(argv) - tail]), list(argv[len(argv) - tail :])


def _dry_run_tokens(p: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--dry-run`` takes an optional value, and argparse would take `--dry-run train.py` as N = train.py.
    Before the script (walking the options, each with the values its action takes), a bare ``--dry-run`` is
    folded with a following number into ``--dry-run=N``, else becomes ``--dry-run=2``; the script's own
    arguments are left as they are."""
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("-") or tok == "--":
            return [*out, *argv[i:]]  # the script (or -- before it) and its arguments
        if tok == "--dry-run":
            number = i + 1 < len(argv) and argv[i + 1].isdigit()
            out.append(f"--dry-run={argv[i + 1]}" if number else "--dry-run=2")
            i += 2 if number else 1
            continue
        action = p._option_string_actions.get(tok)
        takes = 0 if action is None or "=" in tok or action.nargs == 0 else 1
        out.extend(argv[i:i + 1 + takes])
        i += 1 + takes
    return out


def dry_run_steps(value: str | None) -> int | None:
    """--dry-run's N (None: not asked for); LaunchError for anything but a positive count."""
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise LaunchError(f"--dry-run={value}: give the number of optimizer steps to run, e.g. --dry-run=2")
    return int(value)


def _strip_ours(tokens: list[str]) -> list[str]:
    out, skip = [], 0
    for tok in tokens:
        if skip:
            skip -= 1
            continue
        name = tok.split("=", 1)[0]
        if name in _OURS:
            skip = _OURS[name] if "=" not in tok else 0
            continue
        out.append(tok)
    return out


OMP_VAR = "OMP_NUM_THREADS"
SHARE_STORE_OPT_OUT = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""Set for dynamic (c10d, etcd) rendezvous unless the user set it.

With the shared store, torchrun builds the workers' store address once per agent: after a node
rejoins an elastic job, the new agent (rank 0 or not) and the old ones point their workers at
different stores, or the newcomer waits for an address nobody publishes, and the job splits or
hangs. Without sharing, every rendezvous round gets a fresh store from its rank 0, so no round can
read the previous one's keys either.
"""


def plan(argv: Sequence[str], acc: Accelerator, env: Mapping[str, str],
         route: Callable[[str], Interface] | None = None) -> LaunchPlan:
    """Turn `npudist launch` arguments into what to run, without running anything but reading the
    kernel's route to the master (``route``, injectable) for a multi-node job."""
    if not argv:
        raise LaunchError("give the training script to run: npudist launch [options] SCRIPT [ARGS]")
    ns, head, tail = _split(argv)
    simulated = _simulation(ns.simulate, env)
    if simulated:
        from npudist.accelerators.vendors import SIMULATED_NPU

        acc = Accelerator(SIMULATED_NPU)  # the ranks' accelerator; this process installs nothing
        env = {**env, **simulated}
    if ns.peer_snapshots is not None and (ns.peer_snapshots < 1 or ns.mpi):
        raise LaunchError(f"--peer-snapshots {ns.peer_snapshots}: give a step count >= 1, and launch through "
                          "torchrun (not --mpi): the holder lives in the torchrun agent's process")
    run_dir = {RUN_DIR_VAR: os.path.abspath(ns.run_dir)} if ns.run_dir else {}
    dry = dry_run_steps(ns.dry_run)
    if dry is not None:  # the ranks' variable (npudist/dry_run.py), beside the run directory's
        run_dir[DRY_RUN_VAR] = str(dry)
    if ns.tensorboard:
        from npudist.telemetry.job.tensorboard import missing_message

        why = missing_message(ns.tensorboard)  # said once here, before any rank starts
        if why is not None:
            raise LaunchError(why)
        run_dir[TENSORBOARD_VAR] = os.path.abspath(ns.tensorboard)
    if ns.mpi:
        the_plan = _plan_mpi(ns, head, tail, env)
        the_plan.env_updates.update(simulated)
        the_plan.exec_env.update(run_dir)
        return _with_metrics(the_plan, ns, env)
    head = _strip_ours(head)
    nproc = resolve_nproc(ns.nproc_per_node if _option_given(head, ("--nproc-per-node", "--nproc_per_node"))
                          else None, acc, env)
    check_devices(nproc, acc, env)
    head = [t for i, t in enumerate(head) if not _is_nproc_token(head, i)]
    head = ["--nproc-per-node", str(nproc), *head]
    single_node = str(ns.nnodes) in ("1", "1:1")
    static = ns.rdzv_backend == "static" and not ns.standalone
    if static and single_node and not _option_given(head, ("--master-port", "--master_port")):
        # torchrun's fixed default (29500) collides with any other job on the machine; a single node
        # needs no well-known port, so take a free one.
        head = ["--master-port", str(free_port()), *head]
    elif static and ns.master_port is not None and int(ns.node_rank) == 0 and port_in_use(
        ns.master_addr, int(ns.master_port)
    ):
        raise LaunchError(
            f"--master-port {ns.master_port} is already in use on this host (another job or a stale rank). "
            "Choose a free port or stop the process holding it."
        )
    the_plan = LaunchPlan("torchrun", torchrun_argv=[*head, *tail], nproc_per_node=nproc,
                          script=None if ns.module or ns.no_python else tail[0])
    the_plan.env_updates.update(simulated)
    the_plan.env_updates.update(run_dir)  # the ranks' run log and hang reports (npudist.training)
    if dry is not None:
        the_plan.notes.append(f"dry run: each rank stops after {dry} optimizer step{'s' if dry > 1 else ''} and a "
                              "checkpoint saved and loaded back")
    the_plan.peer_snapshots, the_plan.multi_node = ns.peer_snapshots, not single_node and not ns.standalone
    the_plan.peer_bind = ns.peer_snapshot_bind or "127.0.0.1"
    if ns.peer_snapshots is not None and the_plan.multi_node:
        _plan_peer_holder(the_plan, ns, multinode.master_host(ns, static), env, route or network.route_to)
    if ns.accelerator:
        the_plan.env_updates[ACCELERATOR_VAR] = ns.accelerator
    if acc.device_type == "npu":
        from npudist.ranktable.path import hccl_path

        the_plan.notes.append(hccl_path(env))
    if nproc > 1 and OMP_VAR not in env:
        # torchrun sets the same value but warns about it in a banner on every launch; say it once, with why.
        the_plan.env_updates[OMP_VAR] = "1"
        the_plan.notes.append(f"{OMP_VAR}=1 for each of the {nproc} ranks, so they do not oversubscribe this "
                              f"host's {os.cpu_count()} cores; export {OMP_VAR} to choose another value")
    if single_node and not any(env.get(v, "") not in ("", "none") for v in RUN_ID_SOURCES) \
            and ns.rdzv_id in ("", "none"):
        # The ranks' `run` label (telemetry/exposition/run_label.py): one value for this launch's ranks, so
        # the next run on the same ports is told apart in Prometheus.
        the_plan.env_updates[RUN_ID_VAR] = new_run_id()
    if not static and not ns.standalone and SHARE_STORE_OPT_OUT not in env:
        the_plan.env_updates[SHARE_STORE_OPT_OUT] = "1"
    if not single_node and not ns.standalone:
        chosen, notes = multinode.with_interface(
            the_plan.torchrun_argv, multinode.master_host(ns, static), env, route or network.route_to,
            is_c10d=ns.rdzv_backend == "c10d" and not static, rdzv_conf=ns.rdzv_conf or None,
            local_addr_given=ns.local_addr is not None)
        the_plan.env_updates.update(chosen)
        the_plan.notes.extend(notes)
    return _with_metrics(the_plan, ns, env)


def _plan_peer_holder(the_plan: LaunchPlan, ns: argparse.Namespace, master: str, env: Mapping[str, str],
                      route: Callable[[str], Interface]) -> None:
    """Over several nodes: the holder's address on the job's network, and a secret every node shares."""
    from npudist.checkpoint import peer_auth

    try:
        the_plan.peer_bind, note = multinode.peer_holder_bind(ns.peer_snapshot_bind, master, route, str(ns.nnodes))
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    if note:
        the_plan.notes.append(note)
    if not env.get(peer_auth.SECRET_VAR, "").strip() and not env.get(peer_auth.SECRET_FILE_VAR, "").strip():
        raise LaunchError(peer_auth.missing_on_several_nodes())


def _simulation(value: str | None, env: Mapping[str, str]) -> dict[str, str]:
    """The ranks' variables for ``--simulate MODE``: the mode, the ``torch_npu`` stand-in first on
    PYTHONPATH, and under ``npu:strict`` the hccl-strict profile for npudist's own collectives (what a
    user of a first-generation 910 sets) unless NPUDIST_COMM_PROFILE already says otherwise."""
    if value is None:
        return {}
    mode = value.strip().lower()
    if mode not in SIMULATE_MODES:
        raise LaunchError(f"--simulate {value!r}: choose one of {', '.join(SIMULATE_MODES)}")
    from pathlib import Path

    import npudist.sim

    stand_in = str(Path(npudist.sim.__file__).parent / "stand_in")
    paths = [stand_in, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != stand_in]]
    out = {SIMULATE_VAR: mode, "PYTHONPATH": os.pathsep.join(paths)}
    if mode.endswith(":strict") and not env.get(PROFILE_VAR):
        out[PROFILE_VAR] = "hccl-strict"
    return out


def _with_metrics(the_plan: LaunchPlan, ns: argparse.Namespace, env: Mapping[str, str]) -> LaunchPlan:
    """--metrics-port/--targets-file: the ranks' port variable and the file_sd targets (telemetry.targets).

    Under --mpi each rank runs its own launch; local rank 0 writes the file for every rank of its node.
    """
    if ns.metrics_port is None:
        if ns.targets_file:
            raise LaunchError("--targets-file lists the ranks' metrics endpoints: add --metrics-port PORT")
        return the_plan
    from npudist.telemetry.exposition import targets
    from npudist.telemetry.exposition.server import ExporterError

    if the_plan.mode == "mpi":
        info = rank_info(the_plan.exec_env)
        nproc, mine = info.local_world_size, [info.local_rank]
        writes = info.local_rank == 0
    else:
        nproc = the_plan.nproc_per_node or 1
        mine, writes = list(range(nproc)), True
    host = _settings(env).metrics_host or "127.0.0.1"
    try:
        ports = targets.rank_ports(ns.metrics_port, nproc)
    except ExporterError as exc:
        raise LaunchError(str(exc)) from None
    busy = [ports[i] for i in mine if port_in_use(host, ports[i])]
    if busy:
        raise LaunchError(f"--metrics-port {ns.metrics_port}: port(s) {', '.join(map(str, busy))} on {host} "
                          "already in use; rank i serves on PORT+i, so choose a base port with a free range.")
    the_plan.env_updates[PORT_VAR] = str(ns.metrics_port)
    if the_plan.mode == "mpi":
        the_plan.exec_env.update(the_plan.env_updates)
    if ns.targets_file and writes:
        the_plan.targets_file = ns.targets_file
        the_plan.targets = targets.targets_document(targets.target_host(host), ports)
    return the_plan


def _is_nproc_token(tokens: list[str], i: int) -> bool:
    names = ("--nproc-per-node", "--nproc_per_node")
    tok = tokens[i]
    if tok in names or any(tok.startswith(n + "=") for n in names):
        return True
    return i > 0 and tokens[i - 1] in names


def _plan_mpi(ns: argparse.Namespace, head: list[str], tail: list[str], env: Mapping[str, str]) -> LaunchPlan:
    info = rank_info(env)
    if info.source not in ("openmpi", "mpich", "slurm"):
        raise LaunchError(
            "--mpi expects to be started by mpirun or srun, but none of OMPI_COMM_WORLD_RANK, PMI_RANK or "
            "SLURM_PROCID is set. Run `mpirun -n N npudist launch --mpi SCRIPT`, or drop --mpi to use torchrun."
        )
    addr = env.get("MASTER_ADDR", "").strip()
    if not addr:
        if _option_given(head, ("--master-addr", "--master_addr")):
            addr = ns.master_addr
        elif info.local_world_size >= info.world_size:
            addr = "127.0.0.1"  # every rank is on this host
        else:
            raise LaunchError(
                f"{info.world_size} MPI ranks span several nodes: pass --master-addr HOST (the host of rank 0) "
                "or export MASTER_ADDR through mpirun (-x MASTER_ADDR=HOST)."
            )
    raw_port = env.get("MASTER_PORT", "").strip() or (str(ns.master_port) if ns.master_port else "29500")
    if not raw_port.isdigit():
        raise LaunchError(f"MASTER_PORT / --master-port {raw_port!r} is not a port number")
    child_env = {**env, **torchrun_env(info, addr, int(raw_port))}
    script, args = tail[0], tail[1:]
    if ns.no_python:
        argv = [script, *args]
    elif ns.module:
        argv = [sys.executable, "-u", "-m", script, *args]
    else:
        argv = [sys.executable, "-u", script, *args]
    if ns.accelerator:
        child_env[ACCELERATOR_VAR] = ns.accelerator
    return LaunchPlan("mpi", exec_argv=argv, exec_env=child_env,
                      script=None if ns.module or ns.no_python else script)


