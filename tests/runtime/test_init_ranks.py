"""init() in real processes over gloo, started by torchrun, Open MPI's mpirun, and Slurm-style variables."""

import json
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, child_env, free_port, run_npudist

PROBE = str(REPO / "tests" / "runtime" / "rank_probe.py")
pytestmark = [pytest.mark.slow, pytest.mark.ranks]


@pytest.fixture
def out(tmp_path):
    return tmp_path


def _records(folder) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()]


def _check_two_ranks(records: list[dict], source: str) -> None:
    joined = sorted((r for r in records if "sum" in r), key=lambda r: r["rank"])
    assert [r["rank"] for r in joined] == [0, 1]
    for r in joined:
        assert (r["world"], r["source"], r["backend"], r["device"]) == (2, source, "gloo", "cpu")
        assert r["sum"] == 3.0  # 1 + 2: a real all_reduce crossed the processes
        assert r["idempotent"] is True
    assert [r["local_rank"] for r in joined] == [0, 1]
    assert all(r["after_shutdown"] is False for r in records if "after_shutdown" in r)


def test_torchrun_through_npudist_launch(out):
    done = run_npudist(["launch", "--nproc-per-node", "2", PROBE], env=child_env({"PROBE_OUT": str(out)}),
                       timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_two_ranks(_records(out), "torchrun")


def _spawn_pair(env_for_rank, out) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, PROBE, "60"], env=child_env({**env_for_rank(r), "PROBE_OUT": str(out)}),
                             cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]


def _wait(procs: list[subprocess.Popen], timeout: float = 120) -> tuple[list[int], str]:
    codes, errs = [], ""
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        codes.append(p.returncode)
        errs += err
    return codes, errs


def test_slurm_style_variables(out):
    port = free_port()
    procs = _spawn_pair(lambda r: {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
                                   "SLURM_TASKS_PER_NODE": "2", "SLURM_NODEID": "0",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}, out)
    codes, errs = _wait(procs)
    assert codes == [0, 0], errs[-3000:]
    _check_two_ranks(_records(out), "slurm")


def _mpirun() -> list[str]:
    exe = shutil.which("mpirun")
    if exe is None:
        pytest.skip("mpirun (openmpi-bin) is not installed; .ci/run installs it")
    return [exe, "--allow-run-as-root", "--oversubscribe", "-n", "2"]


def test_real_mpirun_with_master_addr(out):
    port = free_port()
    cmd = [*_mpirun(), "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}", "-x", "PYTHONPATH",
           "-x", "PROBE_OUT", sys.executable, PROBE, "60"]
    done = subprocess.run(cmd, env=child_env({"PROBE_OUT": str(out)}), cwd=REPO, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_two_ranks(_records(out), "openmpi")


def test_real_mpirun_without_master_addr_names_the_variable(out):
    cmd = [*_mpirun(), "-x", "PYTHONPATH", "-x", "PROBE_OUT", sys.executable, PROBE, "20"]
    done = subprocess.run(cmd, env=child_env({"PROBE_OUT": str(out)}), cwd=REPO, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode != 0
    errors = [r["error"] for r in _records(out) if "error" in r]
    assert len(errors) == 2
    assert all("MASTER_ADDR is not set" in e and "MASTER_ADDR=127.0.0.1" in e for e in errors)


def test_mpirun_npudist_launch_mpi_trains():
    cmd = [*_mpirun(), "-x", "PYTHONPATH", sys.executable, "-m", "npudist", "launch", "--mpi",
           "--master-port", str(free_port()), "examples/train_ddp.py", "--steps", "12", "--log-every", "4",
           "--every-rank-done"]
    done = subprocess.run(cmd, env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank=0 done steps=12" in done.stdout and "rank=1 done steps=12" in done.stdout
    assert "world=2" in done.stdout


def test_port_in_use_is_named(out):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = child_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": str(port), "PROBE_OUT": str(out)})
        done = subprocess.run([sys.executable, PROBE, "10"], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 3, done.stderr[-2000:]
    error = _records(out)[0]["error"]
    assert f"127.0.0.1:{port} is already in use" in error and "MASTER_PORT" in error


def test_rendezvous_timeout_names_what_to_check(out):
    port = free_port()  # nobody listens: rank 0 was never started
    env = child_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(port), "PROBE_OUT": str(out)})
    start = time.monotonic()
    done = subprocess.run([sys.executable, PROBE, "4"], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 3, done.stderr[-2000:]
    assert time.monotonic() - start < 60  # bounded by the 4 s timeout plus start-up, not torch's 10 min
    error = _records(out)[0]["error"]
    assert "rank 1 of 2" in error and f"127.0.0.1:{port}" in error and "timed out" in error
    assert "all 2 ranks were started" in error


@pytest.mark.parametrize("mode", ["shutdown", "destroy"])
def test_no_thread_outlives_teardown(out, mode):
    """gloo's workers or the watchdog publisher alive into interpreter exit can abort the process."""
    script = str(REPO / "tests" / "runtime" / "rank_exit.py")
    proc = run_npudist(["launch", "--nproc-per-node", "2", script, mode], env=child_env({"PROBE_OUT": str(out)}))
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = sorted(_records(out), key=lambda r: r["rank"])
    assert records == [{"rank": 0, "threads_left": []}, {"rank": 1, "threads_left": []}]
