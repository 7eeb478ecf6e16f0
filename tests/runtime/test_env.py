"""Rank layouts from each launcher's variables, written as the launchers document them."""

import pytest

from npudist.runtime.env import EnvError, LauncherEnv, launcher_env, rank_info, torchrun_env


def test_no_launcher_is_a_world_of_one():
    info = rank_info({})
    assert (info.rank, info.world_size, info.local_rank, info.source) == (0, 1, 0, "single")
    assert not info.needs_rendezvous_address


def test_torchrun_variables():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}
    info = rank_info(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.node_rank) == (5, 8, 1, 4, 1)
    assert info.source == "torchrun" and not info.needs_rendezvous_address


def test_open_mpi_variables():
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    info = rank_info(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 1, 2)
    assert info.node_rank == 1  # rank 3 with 2 ranks per node sits on the second node
    assert info.source == "openmpi" and info.needs_rendezvous_address


def test_mpich_intel_mpi_variables():
    info = rank_info({"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"})
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.source) == (2, 3, 2, 3, "mpich")


def test_slurm_variables_with_compressed_tasks_per_node():
    env = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_TASKS_PER_NODE": "4(x2)",
           "SLURM_NODEID": "1"}
    info = rank_info(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.node_rank) == (6, 8, 2, 4, 1)
    assert info.source == "slurm"


def test_innermost_launcher_wins():
    # torchrun started inside a Slurm allocation: torchrun's variables describe this process.
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
           "LOCAL_WORLD_SIZE": "2"}
    assert rank_info(env).source == "torchrun"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is outside 0..1"),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "0"}, "OMPI_COMM_WORLD_SIZE=0"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=3"),
    ],
)
def test_bad_values_name_the_variable(env, named):
    with pytest.raises(EnvError, match=named.replace("(", r"\(").replace(".", r"\.")):
        rank_info(env)


def test_torchrun_env_round_trips():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    mapped = torchrun_env(rank_info(env), "10.0.0.1", 1234)
    assert mapped["MASTER_ADDR"] == "10.0.0.1" and mapped["MASTER_PORT"] == "1234"
    again = rank_info(mapped)
    assert (again.rank, again.world_size, again.local_rank, again.source) == (1, 2, 1, "torchrun")


def test_init_errors_say_what_happened():
    from datetime import timedelta

    from npudist.lifecycle import _explain
    from npudist.runtime.env import RankInfo

    info = RankInfo(1, 2, 1, 2, 0, "openmpi")
    refused = _explain(RuntimeError("Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: "
                                    "SO_ERROR: Connection refused, remote=[127.0.0.1]:25996"),
                       info, "h:1", timedelta(60))
    assert "refused the connection" in str(refused) and "rank 1 of 2" in str(refused)
    assert "timed out after" not in str(refused)  # gloo says "timed out" but nothing waited 60 s
    slow = _explain(RuntimeError("Timed out after 61 seconds waiting for clients. 1/2 clients joined."), info,
                    "h:1", timedelta(seconds=60))
    assert "timed out after 60 s (1 of 2 ranks joined)" in str(slow)
    busy = _explain(RuntimeError("The server socket has failed to listen on any local network address. "
                                 "port: 29500, useIpv6: false, code: -98, "
                                 "name: EADDRINUSE, message: address already in use"),
                    info, "h:29500", timedelta(seconds=60))
    assert "is already in use" in str(busy)


def test_torchelastics_variables_are_one_record():
    env = {"MASTER_ADDR": " 10.0.0.1 ", "MASTER_PORT": "29400", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3",
           "TORCHELASTIC_ERROR_FILE": "/tmp/err.json", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert launcher_env(env) == LauncherEnv(
        master_addr="10.0.0.1", master_port="29400", local_rank=1, local_world_size=4, run_id="job7",
        restart_count=2, max_restarts=3, error_file="/tmp/err.json", use_agent_store=True)
    assert launcher_env(env).address() == "10.0.0.1:29400"


def test_outside_a_launcher_the_record_says_unset_not_zero():
    launcher = launcher_env({})
    assert launcher == LauncherEnv()
    assert (launcher.local_rank, launcher.max_restarts, launcher.address()) == (None, None, "?:?")


@pytest.mark.parametrize(("name", "raw", "field", "value"), [
    ("TORCHELASTIC_RUN_ID", "none", "run_id", ""),  # torchrun's static rendezvous: no job id
    ("TORCHELASTIC_RESTART_COUNT", "x", "restart_count", 0),
    ("LOCAL_WORLD_SIZE", "four", "local_world_size", None),
    ("TORCHELASTIC_USE_AGENT_STORE", "1", "use_agent_store", False),  # torch writes exactly "True"
])
def test_placeholders_and_garbage_read_as_unset(name, raw, field, value):
    assert getattr(launcher_env({name: raw}), field) == value


LAUNCHER_VARIABLES = (r"(?:MASTER_ADDR|MASTER_PORT|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK"
                      r"|TORCHELASTIC_\w+)")
# Modules that look these variables up without reading this worker's launcher: launch reads the launching
# shell's environment to fill a child's (a plan, tested as data), mttr another process's; the rest belong to
# moves in progress by other hands this session (sim), and switch to launcher_env after them.
NOT_READERS = ("runtime/env.py", "launch.py", "launch_multinode.py", "launch/", "testing/mttr.py", "sim/")
"""Paths relative to src/npudist; one ending in / covers its folder."""


def test_launcher_variables_are_read_in_runtime_env_only():
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "npudist"
    pattern = re.compile(r"(?:environ|env|getenv)\s*(?:\.get\(|\[|\()\s*[\"']" + LAUNCHER_VARIABLES + r"[\"']")
    readers = sorted(name for p in src.rglob("*.py") if not (name := p.relative_to(src).as_posix()).startswith(
        NOT_READERS) and pattern.search(p.read_text(encoding="utf-8")))
    assert readers == [], f"read launcher variables through npudist.runtime.env.launcher_env in {readers}"
