"""`npudist observe` owns what it starts: a stop signal reaches the job once and the job stops cleanly (its
targets file emptied) before Prometheus and the exporter stop; no server outlives observe, even SIGKILLed;
a port left in TIME_WAIT by the last run is free; the printed pages exist on the Prometheus it started."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from npudist.dashboards.observe import ObserveError, check_port_free, listed_targets, ui_links
from tests.conftest import REPO, child_env, free_port
from tests.dashboards.prom import PROMETHEUS

needs_prometheus = pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="Debian prometheus not installed")


def _time_wait_port() -> int:
    """A port with a connection in TIME_WAIT on the listening side and nothing listening any more, left by a
    server that set SO_REUSEADDR as Prometheus (Go's net package) does."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()  # the server side closes first: its end of the connection waits 60 s in TIME_WAIT
        time.sleep(0.1)
        client.close()
    return port


def test_a_port_in_time_wait_is_free_but_a_listener_is_not():
    port = _time_wait_port()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # what the old pre-check did: "port in use" for a minute
    check_port_free(port)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(ObserveError, match="already in use"):
            check_port_free(other.getsockname()[1])


def test_the_printed_pages_are_the_ones_this_prometheus_serves():
    classic_only = {"http://p/classic/targets", "http://p/classic/alerts", "http://p/classic/graph"}  # Debian 2.42
    assert ui_links("http://p", classic_only.__contains__) == {
        "targets": "http://p/classic/targets", "alerts": "http://p/classic/alerts", "graph": "http://p/classic/graph"}
    assert ui_links("http://p", lambda u: "/classic/" not in u)["targets"] == "http://p/targets"  # 3.x


def test_targets_left_behind_are_counted(tmp_path):
    f = tmp_path / "t.json"
    assert listed_targets(f) == 0
    f.write_text(json.dumps([{"targets": ["127.0.0.1:1", "127.0.0.1:2"], "labels": {}}]))
    assert listed_targets(f) == 2
    f.write_text("[]")
    assert listed_targets(f) == 0


def _observe(tmp_path: Path, port: int, *command: str, keep: bool = True) -> subprocess.Popen:
    argv = [sys.executable, "-m", "npudist", "observe", "--targets-file", str(tmp_path / "targets.json"),
            "--port", str(port), "--exporter-port", str(free_port()), "--out", str(tmp_path / "obs"),
            "--keep-after" if keep else "--exit-after"]
    return subprocess.Popen([*argv, *(("--", *command) if command else ())], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=child_env(), start_new_session=True)


def _servers(proc: subprocess.Popen, timeout: float = 60) -> list[psutil.Process]:
    """Prometheus and the exporter, once both run."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        kids = psutil.Process(proc.pid).children()
        names = " ".join(" ".join(k.cmdline()) for k in kids)
        if "prometheus" in names and "exporter" in names:
            return kids
        time.sleep(0.2)
    raise AssertionError("observe did not start Prometheus and the exporter")


def _ready(port: int, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("Prometheus never became ready")


@pytest.mark.subprocess
@needs_prometheus
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_no_server_outlives_observe_whatever_signal_ends_it(tmp_path, sig):
    port = free_port()
    proc = _observe(tmp_path, port)
    try:
        servers = _servers(proc)
        _ready(port)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        _, alive = psutil.wait_procs(servers, timeout=20)
        assert not alive, [p.cmdline() for p in alive]
        if sig != signal.SIGKILL:
            assert proc.returncode == 0 and "stopped; data kept in" in out and "Traceback" not in out, out
        check_port_free(port)  # and the port is free for the next observe at once
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _training(targets: Path) -> bool:
    """Both ranks listed and serving their metrics: they joined the group and run the example's loop."""
    if listed_targets(targets) < 2:
        return False
    for group in json.loads(targets.read_text()):
        for target in group["targets"]:
            try:
                with urllib.request.urlopen(f"http://{target}/metrics", timeout=2):
                    pass
            except OSError:
                return False
    return True


@pytest.mark.e2e
@needs_prometheus
@pytest.mark.slow
def test_ctrl_c_reaches_the_job_once_and_it_stops_cleanly_before_prometheus(tmp_path):
    port, targets = free_port(), tmp_path / "targets.json"
    job = [sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", "--metrics-port",
           str(free_port()), "--targets-file", str(targets), "examples/train_ddp.py", "--steps", "100000"]
    proc = _observe(tmp_path, port, *job)
    try:
        end = time.monotonic() + 120
        while not _training(targets) and time.monotonic() < end:
            time.sleep(0.3)
        assert _training(targets), "the ranks never served their metrics"
        time.sleep(1)  # Ctrl-C while the ranks train, not while they import torch (that prints its own traceback)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert json.loads(targets.read_text()) == [], out
    assert out.count("SIGINT passed on to the job") == 1 and "interrupted at step" in out, out
    assert "Traceback" not in out and "stopped; data kept in" in out, out
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2)
