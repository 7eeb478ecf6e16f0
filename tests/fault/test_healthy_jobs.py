"""Never kill a healthy job: long one-rank phases run to the end with npudist's default hang settings.

Each pattern is a real 2-rank job (tests/fault/healthy_job.py, written after nanoGPT's, Hugging Face's and
pytorch/examples' scripts) with one phase longer than the hang bound's 10 s floor, plus the cooperative
inference front idle for two minutes and then serving. The jobs run side by side, so the whole test costs
about as long as its longest job. Every job must end with exit 0 and no abort; where the others waited in
a watched collective, the verdict line must say what the long rank was doing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import REPO, child_env

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
# The durations: a 40 s evaluation on rank 0, a minute of start-up work on one rank, a front idle for
# two minutes; the checkpoint and the slow batch only need to pass the 10 s floor with margin.
PATTERNS = {"eval-ddp": 40, "eval-barrier": 40, "start": 60, "checkpoint": 20, "loader": 20}
EXPECTED = {  # what the verdict line says of the long rank (None: no verdict line at all)
    "eval-ddp": "answered: live and busy", "start": "answered: live and busy", "checkpoint": "answered: live and busy",
    # The others wait in dist.barrier(), which npudist did not issue: the process-group watch sees it.
    "loader": "answered: live but stuck", "eval-barrier": "answered: live and busy"}
FRONT_IDLE_S = 120


def _launch(args: list[str], log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "2", *args],
                            env=child_env(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)


def _predict(port: int) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=json.dumps({"inputs": [[0.5] * 8]}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_long_one_rank_phases_and_an_idle_front_survive_default_settings(tmp_path):
    jobs = {}
    for name, seconds in PATTERNS.items():
        out = tmp_path / name
        out.mkdir()
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 (closed below)
        jobs[name] = (_launch([str(REPO / "tests/fault/healthy_job.py"), name, str(seconds), str(out)], log), log)
    port_file = tmp_path / "front.port"
    front_log = open(tmp_path / "front.log", "w")  # noqa: SIM115
    front = _launch([str(REPO / "examples/edge_ensemble.py"), "--steps", "20", "--test-samples", "50", "--serve",
                     "--port", "0", "--port-file", str(port_file), "--allow-shutdown"], front_log)
    try:
        deadline = time.monotonic() + 180
        while not port_file.exists() and front.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert port_file.exists(), (tmp_path / "front.log").read_text()[-3000:]
        port = int(port_file.read_text())
        served_at = time.monotonic() + FRONT_IDLE_S
        assert _predict(port)["labels"]  # it serves before the pause ...
        while time.monotonic() < served_at:
            assert front.poll() is None, (tmp_path / "front.log").read_text()[-3000:]
            time.sleep(1)
        answer = _predict(port)  # ... and after two minutes without a request
        assert len(answer["labels"]) == 1
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/shutdown", data=b"",
                                                      method="POST"), timeout=30).read()
        assert front.wait(120) == 0
        for name, (proc, _) in jobs.items():
            assert proc.wait(300) == 0, (name, (tmp_path / f"{name}.log").read_text()[-3000:])
    finally:
        for proc in [front, *(p for p, _ in jobs.values())]:
            if proc.poll() is None:
                proc.kill()
        for log in [front_log, *(lg for _, lg in jobs.values())]:
            log.close()
    front_text = (tmp_path / "front.log").read_text()
    assert "aborting" not in front_text and "exitcode" not in front_text
    assert "answered: declared busy in 'serving requests" in front_text  # the followers' wait was seen, and expected
    for name, expected in EXPECTED.items():
        text = (tmp_path / f"{name}.log").read_text()
        assert "aborting" not in text and text.count(f"DONE {name} ") == 2, (name, text[-3000:])
        lines = [ln for ln in text.splitlines() if ln.startswith(("npudist hang:", "npudist busy:"))]
        if expected is None:
            assert lines == [], (name, lines)
        else:
            assert lines and expected in lines[0], (name, text[-3000:])
