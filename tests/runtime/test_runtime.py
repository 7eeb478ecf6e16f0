"""Settings parsing, and the Runtime's life in one process: started on first use, everything ended by close."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

import npudist
from npudist import comm
from npudist.comm.state import state as comm_state
from npudist.runtime import Settings, SettingsError, state


def test_settings_parse_every_variable_into_its_type():
    s = Settings.from_env({
        "NPUDIST_ACCELERATOR": " NPU ", "NPUDIST_TIMEOUT": "90.5", "NPUDIST_COMM_PROFILE": "hccl-strict",
        "NPUDIST_COMM_DEBUG": "yes", "NPUDIST_COMM_SYNC_TIMING": "0", "NPUDIST_RUN_DIR": "/runs/a",
        "NPUDIST_WATCHDOG_OFF": "1", "NPUDIST_METRICS_PORT": "9400", "NPUDIST_METRICS_HOST": "0.0.0.0",
        "NPUDIST_CPU_NPROC": "3", "NPUDIST_SYSFS_ROOT": "/fake", "NPUDIST_NODE_NAME": "node-7",
        "NPUDIST_HANG_TIMEOUT": "30", "NPUDIST_HANG_ACTION": "Report",
    })
    assert s == Settings(accelerator="npu", timeout_s=90.5, comm_profile="hccl-strict", comm_debug=True,
                         sync_timing=False, run_dir="/runs/a", watchdog=False, metrics_port=9400,
                         metrics_host="0.0.0.0", cpu_nproc=3, sysfs_root="/fake", node_name="node-7",
                         hang_timeout_s=30.0, hang_action="report")
    assert Settings.from_env({}) == Settings()
    assert Settings.from_env({"NPUDIST_TIMEOUT": " ", "NPUDIST_METRICS_PORT": ""}) == Settings()


@pytest.mark.parametrize(("var", "value", "says"), [
    ("NPUDIST_TIMEOUT", "soon", "NPUDIST_TIMEOUT='soon' is not a number of seconds"),
    ("NPUDIST_TIMEOUT", "-5", "must be a positive number of seconds"),
    ("NPUDIST_METRICS_PORT", "94OO", "NPUDIST_METRICS_PORT='94OO' is not a port number"),
    ("NPUDIST_CPU_NPROC", "0", "NPUDIST_CPU_NPROC='0': give a positive integer"),
    # Digits of other scripts pass str.isdigit() and float(); magnitudes no code can use are refused.
    ("NPUDIST_CPU_NPROC", "\u00b2", r"NPUDIST_CPU_NPROC='\u00b2': give a positive integer; give ranks per node, "
                                     "from 1 to 1024"),
    ("NPUDIST_CPU_NPROC", "99999999999999999999", "give a positive integer; give ranks per node, from 1 to 1024"),
    ("NPUDIST_CPU_NPROC", "5000", "NPUDIST_CPU_NPROC='5000': too many; give ranks per node, from 1 to 1024"),
    ("NPUDIST_TIMEOUT", "inf", "NPUDIST_TIMEOUT='inf' is not a number of seconds; give seconds"),
    ("NPUDIST_TIMEOUT", "nan", "is not a number of seconds"),
    ("NPUDIST_TIMEOUT", "1_000", "is not a number of seconds"),
    ("NPUDIST_TIMEOUT", "\uff19\uff10", "is not a number of seconds"),  # full-width 90: float() takes it
    ("NPUDIST_TIMEOUT", "1e300", r"NPUDIST_TIMEOUT='1e300': the timeout must be a positive number of seconds; "
                                 r"give seconds \(at most 30 days\), from 0.001 to 2592000"),
    ("NPUDIST_TIMEOUT", "0", "must be a positive number of seconds"),
    ("NPUDIST_METRICS_PORT", "70000", "NPUDIST_METRICS_PORT='70000': not a port number; give the base port"),
    ("NPUDIST_METRICS_PORT", "\u0669", "is not a port number"),  # Arabic-Indic 9
    ("NPUDIST_HANG_TIMEOUT", "inf", "NPUDIST_HANG_TIMEOUT='inf' is not a number of seconds"),
    ("NPUDIST_HANG_TIMEOUT", "0", "must be a positive number of seconds"),
    ("NPUDIST_HANG_ACTION", "kill", "NPUDIST_HANG_ACTION='kill': choose one of abort, report, off"),
])
def test_a_malformed_variable_is_named_with_what_to_put_there(var, value, says):
    with pytest.raises(SettingsError, match=says):
        Settings.from_env({var: value})


@pytest.fixture
def fresh():
    rt = state.peek()
    if rt is not None:
        rt.close()
    yield
    rt = state.peek()
    if rt is not None:
        rt.close()


def test_the_largest_accepted_timeout_is_usable(fresh, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NPUDIST_TIMEOUT", "2592000")  # the top of the range: init() must take it
    npudist.init()
    npudist.all_reduce(torch.ones(2))
    npudist.shutdown()


def test_init_starts_the_runtime_and_shutdown_ends_everything_it_held(fresh, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    ctx = npudist.init()  # a world of one
    rt = state.peek()
    assert rt is not None and rt.context is ctx and npudist.lifecycle.context() is ctx
    comm.set_profile("hccl-strict")
    npudist.all_reduce(torch.ones(5, dtype=torch.bfloat16))  # adapted: caches the group, uses the pool
    assert comm.stats().get("all_reduce").calls == 1
    held = comm_state()
    assert held.groups and rt.comm is held
    npudist.shutdown()
    assert state.peek() is None and not dist.is_initialized() and npudist.lifecycle.context() is None
    assert held.groups == {} and held.watchdog.record is None
    assert not [t for t in threading.enumerate() if t.name.startswith("npudist")]
    # A plain process group afterwards: the collectives start a new Runtime, with nothing carried over.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        npudist.all_reduce(torch.ones(3))
        assert state.peek() is not rt and comm.stats().get("all_reduce").calls == 1
        assert comm.active_constraints().name == "gloo"  # set_profile() ended with the old Runtime
    finally:
        npudist.shutdown()


def test_a_malformed_timeout_fails_init_with_dist_init_error(fresh, monkeypatch):
    monkeypatch.setenv("NPUDIST_TIMEOUT", "soon")
    with pytest.raises(npudist.DistInitError, match="NPUDIST_TIMEOUT='soon'"):
        npudist.init()


def test_close_ends_owned_parts_in_the_written_order_latest_first_within_a_kind():
    rt = state.Runtime(Settings())
    ended: list[str] = []
    for kind in reversed(state.CLOSE_ORDER):
        if kind not in ("comm", "checkpoints"):
            rt.own(kind, lambda kind=kind: ended.append(kind))
    rt.own("telemetry", lambda: ended.append("telemetry (second)"))
    rt.close()
    assert ended == ["run_logs", "telemetry (second)", "telemetry", "group", "backend", "run_dir_locks"]
    rt.close()  # twice: nothing is closed again
    assert len(ended) == 6


def test_a_part_that_fails_to_close_does_not_keep_the_later_ones_running(caplog):
    rt = state.Runtime(Settings())
    ended: list[str] = []

    def broken() -> None:
        raise OSError("disk gone")

    rt.own("run_logs", broken)
    rt.own("telemetry", lambda: ValueError("returned, not raised"))
    rt.own("run_dir_locks", lambda: ended.append("lock"))
    with pytest.raises(OSError, match="disk gone"):
        rt.close()
    assert ended == ["lock"]
    assert "returned, not raised" in caplog.text  # the second failure is logged, not lost


def test_the_exit_hook_leaves_the_process_group_to_its_creator():
    rt = state.Runtime(Settings())
    ended: list[str] = []
    rt.own("group", lambda: ended.append("group"))
    rt.own("run_dir_locks", lambda: ended.append("lock"))
    rt.close(at_exit=True)
    assert ended == ["lock"]


def test_only_known_kinds_can_be_owned():
    with pytest.raises(ValueError, match="unknown part kind 'threads'"):
        state.Runtime(Settings()).own("threads", lambda: None)
    with pytest.raises(ValueError, match="unknown part kind 'comm'"):  # attached by comm itself
        state.Runtime(Settings()).own("comm", lambda: None)
