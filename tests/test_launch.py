"""`npudist launch` planning (pure) and the example job run for real through it."""

import re
import socket

import pytest

from npudist.accelerators import BY_NAME, Accelerator
from npudist.launch import LaunchError, plan, resolve_nproc
from tests.conftest import child_env, run_npudist

CPU = Accelerator(BY_NAME["cpu"])


class _EightDevices(Accelerator):
    def device_count(self) -> int:
        return 8


NPU8 = _EightDevices(BY_NAME["npu"])


def _value(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


def test_auto_is_two_ranks_on_cpu_and_overridable():
    assert resolve_nproc("auto", CPU, {}) == 2
    assert resolve_nproc(None, CPU, {"NPUDIST_CPU_NPROC": "3"}) == 3
    with pytest.raises(LaunchError, match="NPUDIST_CPU_NPROC='zero'"):
        resolve_nproc("auto", CPU, {"NPUDIST_CPU_NPROC": "zero"})


def test_auto_is_one_rank_per_device_on_an_accelerator():
    assert resolve_nproc("auto", NPU8, {}) == 8
    assert resolve_nproc("3", NPU8, {}) == 3
    with pytest.raises(LaunchError, match="positive integer or 'auto'"):
        resolve_nproc("-1", NPU8, {})


def test_plan_fills_nproc_and_a_free_port_and_passes_everything_else():
    p = plan(["--max-restarts", "3", "train.py", "--steps", "5", "--nproc-per-node", "9"], NPU8, {})
    assert p.mode == "torchrun"
    argv = p.torchrun_argv
    assert _value(argv, "--nproc-per-node") == "8"
    assert int(_value(argv, "--master-port")) > 0
    assert _value(argv, "--max-restarts") == "3"
    # the script's own arguments are untouched, including one that looks like a launcher option
    assert argv[argv.index("train.py"):] == ["train.py", "--steps", "5", "--nproc-per-node", "9"]


@pytest.mark.parametrize("given", [["--nproc-per-node", "4"], ["--nproc_per_node=4"], ["--nproc-per-node=4"]])
def test_explicit_nproc_in_any_spelling_wins(given):
    argv = plan([*given, "train.py"], NPU8, {}).torchrun_argv
    assert argv.count("--nproc-per-node") == 1 and _value(argv, "--nproc-per-node") == "4"
    assert not any(a.startswith("--nproc_per_node") or a.startswith("--nproc-per-node=") for a in argv)


@pytest.mark.parametrize("given", [["--metrics", "9517"], ["--targets", "t.json"], ["--max-rest", "3"],
                                   ["--nproc-per", "4"], ["--mp"]])
def test_abbreviated_options_are_refused_not_half_understood(given):
    with pytest.raises(LaunchError, match=f"unrecognized arguments: {given[0]}"):
        plan([*given, "train.py"], NPU8, {})


@pytest.mark.subprocess
def test_multi_node_rendezvous_is_left_to_torchrun():
    argv = plan(["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400", "t.py"],
                CPU, {}).torchrun_argv
    assert "--master-port" not in argv and _value(argv, "--rdzv-endpoint") == "127.0.0.1:29400"


@pytest.mark.subprocess
def test_dynamic_rendezvous_gives_every_round_a_fresh_store():
    # torchrun's shared store cannot take a node back after it left (the newcomer waits for an address
    # no agent publishes); tests/fault/test_restart.py shows the rejoin this makes work.
    dyn = ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400", "t.py"]
    omp = {"OMP_NUM_THREADS": "1"}  # set by the user: launch adds nothing for it
    assert plan(dyn, CPU, omp).env_updates == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    # the user's own choice stands; static and standalone rendezvous keep torchrun's default
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan(
        dyn, CPU, {**omp, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}).env_updates
    for argv in (["--nproc-per-node", "2", "t.py"], ["--standalone", "t.py"]):
        assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan(argv, CPU, omp).env_updates


def test_busy_master_port_is_refused_with_a_reason():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LaunchError, match=f"--master-port {port} is already in use"):
            plan(["--nnodes", "2", "--master-port", str(port), "t.py"], CPU, {})


def test_no_script_is_an_error():
    with pytest.raises(LaunchError, match="required: training_script"):
        plan(["--nproc-per-node", "2"], CPU, {})


def test_mpi_mode_needs_an_mpi_launcher():
    with pytest.raises(LaunchError, match="OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID"):
        plan(["--mpi", "t.py"], CPU, {})


def test_mpi_mode_maps_variables_for_the_script():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PATH": "/bin"}
    p = plan(["--mpi", "--master-port", "31000", "t.py", "--x", "1"], CPU, env)
    assert p.mode == "mpi" and p.exec_argv[-3:] == ["t.py", "--x", "1"]
    assert {k: p.exec_env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "31000"}
    assert p.exec_env["PATH"] == "/bin"


def test_mpi_mode_across_nodes_needs_an_address():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(LaunchError, match="--master-addr HOST"):
        plan(["--mpi", "t.py"], CPU, env)
    assert plan(["--mpi", "--master-addr", "10.1.1.1", "t.py"], CPU, env).exec_env["MASTER_ADDR"] == "10.1.1.1"


@pytest.mark.e2e
@pytest.mark.slow
def test_example_trains_on_two_ranks_and_loss_falls(golden_run):
    done = golden_run.done  # 100 steps on 2 ranks (tests/conftest.py)
    losses = [float(x) for x in re.findall(r"^step=\d+ loss=([\d.]+)", done.stdout, re.MULTILINE)]
    assert len(losses) >= 5
    assert losses[-1] < 0.6 * losses[0]  # ln(64) ~ 4.2 at the start; the pattern is learnable
    # rank 0 owns the console: progress with step N/total, elapsed, ETA and throughput; no other rank's lines
    assert "rank=0 done steps=100" in done.stdout and "rank=1" not in done.stdout
    assert re.search(r"^step=100 loss=[\d.]+ samples/s=[\d.]+ done=100/100 elapsed=\S+ eta=0s world=2 "
                     r"accelerator=cpu backend=gloo$", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^step=50 .* done=50/100 elapsed=\S+ eta=\d", done.stdout, re.MULTILINE)
    assert re.search(r"^summary: straggler: (no rank flagged in|rank \d+ .*flagged in) \d+", done.stdout, re.MULTILINE)
    assert re.search(r"^final step=100 loss=[\d.]+ params_sha256=[0-9a-f]{64}$", done.stdout, re.MULTILINE)


@pytest.mark.ranks
def test_launch_reports_a_failing_rank():
    done = run_npudist(["launch", "--nproc-per-node", "1", "-m", "json.tool", "/does/not/exist"], timeout=120)
    assert done.returncode == 1
    assert "/does/not/exist" in done.stderr


@pytest.mark.subprocess
def test_cli_version_and_launch_errors():
    import npudist

    v = run_npudist(["--version"])
    assert v.returncode == 0 and v.stdout.strip() == f"npudist {npudist.__version__}"
    bad = run_npudist(["launch", "--nproc-per-node", "0", "x.py"])
    assert bad.returncode == 2 and "--nproc-per-node '0'" in bad.stderr


@pytest.mark.subprocess
def test_help_leads_with_npudist_options_then_torchrun_passed_through():
    res = run_npudist(["launch", "--help"])
    assert res.returncode == 0
    out = res.stdout
    assert out.startswith("usage: npudist launch [npudist options] [torchrun options] SCRIPT")
    assert out.index("npudist options:") < out.index("--accelerator") < out.index(
        "torchrun options (passed through to torchrun):")
    nproc = out[out.index("--nproc-per-node NPROC"):out.index("--rdzv-backend")]
    assert "auto" in nproc and "gpu" not in nproc  # npudist refuses torchrun's gpu/cpu/xpu


@pytest.mark.subprocess
def test_no_script_and_a_missing_script_are_short_usage_errors(tmp_path):
    bare = run_npudist(["launch"])
    assert bare.returncode == 2 and bare.stdout == ""
    assert "give the training script" in bare.stderr and len(bare.stderr.splitlines()) <= 3
    typo = tmp_path / ("deep-" * 30) / "trian.py"  # longer than a terminal line: the path must stay whole
    got = run_npudist(["launch", "--nproc-per-node", "1", str(typo)], timeout=60)
    assert got.returncode == 2 and f"{typo}: no such file" in got.stderr, got.stderr
    assert "Root Cause" not in got.stderr and "Traceback" not in got.stderr


@pytest.mark.subprocess
def test_accelerator_flag_reaches_the_ranks_and_not_torchrun():
    p = plan(["--accelerator", "cpu", "t.py"], CPU, {})
    assert p.env_updates["NPUDIST_ACCELERATOR"] == "cpu"
    assert "--accelerator" not in p.torchrun_argv
    bad = run_npudist(["launch", "--accelerator", "tpu", "t.py"])
    assert bad.returncode == 2 and "unknown accelerator 'tpu'" in bad.stderr


def test_omp_threads_set_once_with_the_reason_unless_the_user_chose():
    p = plan(["--nproc-per-node", "2", "t.py"], CPU, {})
    assert p.env_updates["OMP_NUM_THREADS"] == "1"
    assert len(p.notes) == 1 and "oversubscribe" in p.notes[0]
    mine = plan(["--nproc-per-node", "2", "t.py"], CPU, {"OMP_NUM_THREADS": "4"})
    assert "OMP_NUM_THREADS" not in mine.env_updates and mine.notes == []


def _route_recorder(iface=None, error=None):
    from npudist.runtime.network import Interface, NetworkError

    seen = []

    def route(host):
        seen.append(host)
        if error:
            raise NetworkError(error)
        return iface or Interface("bond0.100", "192.168.1.101")

    return route, seen


def test_multi_node_points_every_backend_at_the_interface_routing_to_the_master():
    route, seen = _route_recorder()
    p = plan(["--nnodes", "2", "--node-rank", "1", "--master-addr", "192.168.1.100", "t.py"], CPU, {}, route=route)
    assert seen == ["192.168.1.100"]
    assert {k: p.env_updates[k] for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HCCL_IF_IP")} == {
        "GLOO_SOCKET_IFNAME": "bond0.100", "NCCL_SOCKET_IFNAME": "=bond0.100", "HCCL_IF_IP": "192.168.1.101"}
    assert p.torchrun_argv[:2] == ["--local-addr", "192.168.1.101"]  # the address torchrun's agent publishes
    note = [n for n in p.notes if n.startswith("multi-node")]
    assert len(note) == 1 and "bond0.100 (192.168.1.101) routes to the master 192.168.1.100" in note[0]


def test_the_users_interface_variable_stands_and_c10d_uses_the_endpoint_host():
    route, seen = _route_recorder()
    argv = ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "192.168.1.100:29400", "t.py"]
    p = plan(argv, CPU, {"GLOO_SOCKET_IFNAME": "ib0"}, route=route)
    assert seen == ["192.168.1.100"] and "GLOO_SOCKET_IFNAME" not in p.env_updates
    assert "kept your GLOO_SOCKET_IFNAME" in " ".join(p.notes)


def test_single_node_and_all_node_local_jobs_set_no_interface():
    route, seen = _route_recorder()
    assert not any("IFNAME" in k for k in plan(["t.py"], CPU, {}, route=route).env_updates) and seen == []
    from npudist.runtime.network import Interface

    lo, _ = _route_recorder(Interface("lo", "127.0.0.1"))
    p = plan(["--nnodes", "2", "--node-rank", "1", "t.py"], CPU, {}, route=lo)
    assert not any("IFNAME" in k for k in p.env_updates)


def test_no_route_to_the_master_is_said_once_and_nothing_is_guessed():
    route, _ = _route_recorder(error="node9 does not resolve")
    p = plan(["--nnodes", "2", "--node-rank", "1", "--master-addr", "node9", "t.py"], CPU, {}, route=route)
    assert not any("IFNAME" in k for k in p.env_updates)
    assert any("no interface chosen (node9 does not resolve)" in n for n in p.notes)


@pytest.mark.parametrize(("address", "is_host"), [("192.168.1.100", "true"), ("192.168.1.101", "false")])
def test_c10d_is_told_who_hosts_the_store_when_the_hostname_does_not_resolve(monkeypatch, address, is_host):
    # torchrun's c10d resolves this host's name to decide, and ends with gaierror where it does not resolve.
    import npudist.launch.multinode as multinode
    from npudist.runtime.network import Interface

    monkeypatch.setattr(multinode, "_hostname_resolves", lambda: False)
    route, _ = _route_recorder(Interface("eth0", address))
    argv = ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "192.168.1.100:29400",
            "--rdzv-conf", "last_call_timeout=2", "t.py"]
    out = plan(argv, CPU, {}, route=route).torchrun_argv
    assert [a for a in out if "last_call_timeout" in a] == [f"last_call_timeout=2,is_host={is_host}"]
    assert out.count("--rdzv-conf") == 1


class _OneGpu(Accelerator):
    def device_count(self) -> int:
        return 1


class _CountFails(Accelerator):
    def device_count(self) -> int:
        raise RuntimeError("driver not loaded")


GPU1 = _OneGpu(BY_NAME["cuda"])


@pytest.mark.parametrize("given", [["--nproc-per-node", "2"], ["--nproc_per_node=2"]])
def test_more_ranks_than_devices_is_refused_naming_found_asked_and_fixes(given):
    with pytest.raises(LaunchError) as caught:
        plan([*given, "train.py"], GPU1, {"CUDA_VISIBLE_DEVICES": "3"})
    text = str(caught.value)
    assert "asks for 2 ranks" in text and "shows 1 device" in text and "CUDA_VISIBLE_DEVICES='3'" in text
    assert "nccl needs one device per rank" in text
    assert "--nproc-per-node 1" in text and "make more devices visible with CUDA_VISIBLE_DEVICES" in text
    assert "--accelerator cpu" in text


def test_as_many_ranks_as_devices_and_gloo_backends_are_not_refused():
    assert _value(plan(["--nproc-per-node", "1", "train.py"], GPU1, {}).torchrun_argv, "--nproc-per-node") == "1"
    assert _value(plan(["--nproc-per-node", "8", "train.py"], CPU, {}).torchrun_argv, "--nproc-per-node") == "8"
    # a device count that cannot be read here refuses nothing: the ranks report the real problem
    plan(["--nproc-per-node", "4", "train.py"], _CountFails(BY_NAME["mlu"]), {})


def test_ascend_and_cambricon_rows_are_checked_too():
    with pytest.raises(LaunchError, match="ASCEND_RT_VISIBLE_DEVICES"):
        plan(["--nproc-per-node", "9", "train.py"], NPU8, {})
    with pytest.raises(LaunchError, match=r"cncl needs one device per rank.*MLU_VISIBLE_DEVICES"):
        plan(["--nproc-per-node", "2", "train.py"], _OneGpu(BY_NAME["mlu"]), {})


def test_simulated_npu_shows_the_chips_of_a_real_host():
    with pytest.raises(LaunchError, match="shows 8 devices"):
        plan(["--simulate", "npu", "--nproc-per-node", "9", "train.py"], CPU, {})
    with pytest.raises(LaunchError, match="shows 2 devices"):
        plan(["--simulate", "npu", "--nproc-per-node", "3", "train.py"], CPU, {"ASCEND_RT_VISIBLE_DEVICES": "4,5"})
    plan(["--simulate", "npu", "--nproc-per-node", "2", "train.py"], CPU, {})


@pytest.mark.subprocess
def test_cli_refuses_before_any_rank_starts(tmp_path):
    script = tmp_path / "never.py"
    marker = tmp_path / "started"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    out = run_npudist(["launch", "--simulate", "npu", "--nproc-per-node", "3", str(script)],
                      env=child_env({"ASCEND_RT_VISIBLE_DEVICES": "0,1"}), timeout=120)
    assert out.returncode != 0 and "asks for 3 ranks" in out.stderr and "shows 2 devices" in out.stderr
    assert not marker.exists()


def test_on_several_nodes_the_peer_holder_binds_the_address_that_routes_to_the_master():
    """Left to a loopback default, every node's holder advertised 127.0.0.1 and no copy crossed a node
    (issue 46): the holder now takes the interface launch already picks for the backends."""
    route, _ = _route_recorder()
    secret = {"NPUDIST_PEER_SECRET": "ab" * 32}
    two = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "192.168.1.100", "--peer-snapshots", "1"]
    p = plan([*two, "t.py"], CPU, secret, route=route)
    assert p.peer_bind == "192.168.1.101" and p.multi_node
    assert any("holder binds 192.168.1.101 (bond0.100" in n for n in p.notes)
    assert plan([*two, "--peer-snapshot-bind", "10.9.0.2", "t.py"], CPU, secret, route=route).peer_bind == "10.9.0.2"
    for unreachable in ("127.0.0.1", "localhost", "0.0.0.0", "::"):
        with pytest.raises(LaunchError, match=f"--peer-snapshot-bind {unreachable} on a job over 2 nodes.*drop "
                                              "--peer-snapshot-bind"):
            plan([*two, "--peer-snapshot-bind", unreachable, "t.py"], CPU, secret, route=route)
    # No secret every node shares: each node's launch would make its own and no copy would be accepted.
    with pytest.raises(LaunchError, match=r"NPUDIST_PEER_SECRET=.*NPUDIST_PEER_SECRET_FILE"):
        plan([*two, "t.py"], CPU, {}, route=route)
    lost, _ = _route_recorder(error="no route to host")
    with pytest.raises(LaunchError, match=r"could not be found.*--peer-snapshot-bind ADDRESS"):
        plan([*two, "t.py"], CPU, secret, route=lost)
    # Every node on this host (the master is loopback): loopback is right; one node keeps its default.
    local = plan(["--nnodes", "2", "--node-rank", "1", "--peer-snapshots", "1", "t.py"], CPU, secret, route=route)
    assert local.peer_bind == "127.0.0.1"
    assert plan(["--peer-snapshots", "1", "t.py"], CPU, {}).peer_bind == "127.0.0.1"


def test_peer_snapshots_are_npudist_s_option_and_bad_values_are_refused():
    p = plan(["--peer-snapshots", "5", "--peer-snapshot-bind", "10.0.0.7", "--nproc-per-node", "2", "t.py"], CPU, {})
    assert (p.peer_snapshots, p.peer_bind) == (5, "10.0.0.7")
    assert not any(t.startswith("--peer") for t in p.torchrun_argv)  # torchrun never sees them
    assert plan(["--nproc-per-node", "2", "t.py"], CPU, {}).peer_snapshots is None
    for bad in (["--peer-snapshots", "0"], ["--mpi", "--peer-snapshots", "5"]):
        with pytest.raises(LaunchError, match="--peer-snapshots"):
            plan([*bad, "t.py"], CPU, {"RANK": "0", "WORLD_SIZE": "1"})
