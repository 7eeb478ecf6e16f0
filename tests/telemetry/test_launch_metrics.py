import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from npudist.accelerators import get
from npudist.launch import LaunchError, plan
from tests.conftest import FAKES, child_env, fakes_path, free_ports, run_npudist
from tests.telemetry.exp_helpers import families, samples

CPU = get("cpu")
RANK_SCRIPT = '''
import json, logging, os, sys, time, urllib.request
import npudist, npudist.telemetry
from npudist.telemetry.job.straggler import StragglerDiagnosis

logging.basicConfig(level=logging.WARNING)
ctx = npudist.init()
# npu-smi is the fake on PATH: the ranks find their chips from its `info -m` and ASCEND_RT_VISIBLE_DEVICES
tel = npudist.telemetry.serve_rank_metrics(ctx, device_source="npu-smi")
# min_dof=1: a 2-rank job's detector judges from its first windows (sensitivity is tested in test_detector)
timer = tel.step_timer(exchange_every=5, straggler_settings={"min_dof": 1})
if ctx.rank == 0:
    timer.on_exchange.append(StragglerDiagnosis(sys.argv[1], windows=2))
for _ in range(40):
    with timer:
        time.sleep(0.08 if ctx.rank == 1 else 0.02)  # rank 1 is the artificial straggler
text = urllib.request.urlopen(tel.server.url, timeout=10).read().decode()
with open(os.path.join(sys.argv[1], f"rank{ctx.rank}.json"), "w") as f:
    json.dump({"port": tel.server.port, "local_rank": ctx.local_rank, "metrics": text,
               "targets": open(os.path.join(sys.argv[1], "sd", "targets.json")).read()}, f)
tel.close()
npudist.shutdown()
'''


def _doc(base: int) -> list:
    return [{"targets": [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"], "labels": {"job": "npudist"}}]


def test_plan_sets_the_port_variable_and_lists_every_rank(tmp_path):
    base = free_ports(2)
    p = plan(["--nproc-per-node", "2", "--metrics-port", str(base), "--targets-file",
              str(tmp_path / "t.json"), "train.py", "--steps", "3"], CPU, {"OMP_NUM_THREADS": "1"})
    run = p.env_updates.pop("NPUDIST_RUN_ID")  # the ranks' run label (run_label.py), one per launch
    assert run and p.env_updates == {"NPUDIST_METRICS_PORT": str(base)}
    assert p.targets_file == str(tmp_path / "t.json")
    assert p.targets == _doc(base)
    assert "--metrics-port" not in p.torchrun_argv and "--targets-file" not in p.torchrun_argv
    assert p.torchrun_argv[-3:] == ["train.py", "--steps", "3"]


def test_plan_without_metrics_changes_nothing():
    p = plan(["--nproc-per-node", "2", "train.py"], CPU, {"OMP_NUM_THREADS": "1"})
    assert set(p.env_updates) <= {"NPUDIST_RUN_ID"} and p.targets_file is None


def test_plan_refuses_bad_metrics_options():
    with pytest.raises(LaunchError, match="add --metrics-port"):
        plan(["--targets-file", "t.json", "train.py"], CPU, {})
    with pytest.raises(LaunchError, match="65535 with 2 ranks"):
        plan(["--nproc-per-node", "2", "--metrics-port", "65535", "train.py"], CPU, {})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port\\(s\\) {port} on 127.0.0.1 already in use"):
            plan(["--nproc-per-node", "1", "--metrics-port", str(port), "train.py"], CPU, {})


def test_under_mpi_only_local_rank_zero_writes_targets(tmp_path):
    base = free_ports(2)
    argv = ["--mpi", "--metrics-port", str(base), "--targets-file", str(tmp_path / "t.json"), "train.py"]
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    p = plan(argv, CPU, env)
    assert p.exec_env["NPUDIST_METRICS_PORT"] == str(base) and p.targets_file is None
    p = plan(argv, CPU, {**env, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    assert p.targets == _doc(base)


@pytest.mark.ranks
@pytest.mark.slow
def test_two_ranks_serve_on_base_plus_local_rank_and_name_the_straggler(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    base, targets = free_ports(2), tmp_path / "sd" / "targets.json"
    env = child_env({"PATH": fakes_path(), "ASCEND_RT_VISIBLE_DEVICES": "4,5",
                     "NPUDIST_FAKE_NPU_SMI_MAP": str(FAKES / "npu-smi" / "info-m-a3-16chip-constructed.txt")})
    res = run_npudist(["launch", "--nproc-per-node", "2", "--metrics-port", str(base), "--targets-file",
                       str(targets), str(script), str(tmp_path)], env=env, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert json.loads(ranks[0]["targets"]) == _doc(base)  # listed while the ranks ran
    assert json.loads(targets.read_text()) == []  # and no longer after they finished
    assert [(r["local_rank"], r["port"]) for r in ranks] == [(0, base), (1, base + 1)]
    fams0, fams1 = families(ranks[0]["metrics"]), families(ranks[1]["metrics"])
    # ASCEND_RT_VISIBLE_DEVICES=4,5 on a node whose NPU n holds logical chips 2n and 2n+1: both ranks
    # compute on NPU 2, rank 0 on its chip 0 and rank 1 on its chip 1
    # Both ranks of one launch carry the one run label launch chose (run_label.py).
    (run,) = {dict(k)["run"] for f in (fams0, fams1) for k in samples(f, "npudist_steps", "npudist_steps_total")}
    assert run
    key0 = (("chip", "0"), ("device", "2"), ("local_rank", "0"), ("node", socket.gethostname()), ("rank", "0"),
            ("run", run))
    key1 = (("chip", "1"), ("device", "2"), ("local_rank", "1"), ("node", socket.gethostname()), ("rank", "1"),
            ("run", run))
    assert samples(fams0, "npudist_steps", "npudist_steps_total") == {key0: 40.0}
    assert samples(fams1, "npudist_steps", "npudist_steps_total") == {key1: 40.0}
    assert samples(fams0, "npudist_straggler_rank") == {key0: 1.0}
    assert samples(fams1, "npudist_rank_straggler") == {key1: 1.0}  # each rank exports its own flag
    assert samples(fams1, "npudist_rank_slowdown_ratio")[key1] > 2  # it sleeps 4x as long as rank 0
    # means about 0.02 s and 0.08 s: std 0.03 / mean 0.05 = 0.6; scheduling noise only lowers it a little
    assert samples(fams0, "npudist_step_skew_ratio")[key0] > 0.3
    assert samples(fams1, "npudist_step_skew_ratio") == {}  # only rank 0 publishes
    # rank 1's host and pid (as it published them), then its card
    slow = re.search(r"straggler: rank 1 \(\S+ pid \d+, device 2 chip 1\) works [\d.]+x the median of the other "
                     r"ranks over steps \d+-\d+ \((\d+\.\d+) s/step\); cause: compute", res.stderr)
    assert slow is not None, res.stderr[-2000:]
    assert float(slow.group(1)) >= 0.08  # it sleeps 0.08 s per step
    (diagnosis,) = tmp_path.glob("straggler-step*.json")
    doc = json.loads(diagnosis.read_text())
    assert doc["straggler_rank"] == 1 and (doc["device"]["npu_id"], doc["device"]["chip_id"]) == (2, 1)
    # where it runs, as rank 1 published it, read by rank 0 which wrote the file
    assert doc["local_rank"] == 1 and doc["pid"] != os.getpid() and doc["host"] and doc["iso_time"].endswith("Z")


SLEEPER = """
import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("started")
try:
    time.sleep(120)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.ranks
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_launch_empties_its_targets_file(tmp_path, sig):
    script, started, targets = tmp_path / "sleeper.py", tmp_path / "started", tmp_path / "targets.json"
    script.write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, "-m", "npudist", "launch", "--nproc-per-node", "1", "--metrics-port",
                             str(free_ports(2)), "--targets-file", str(targets), str(script), str(started)],
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 120
        while not started.exists() and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.2)
        assert started.exists(), proc.communicate(timeout=30)
        assert json.loads(targets.read_text()) != []
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 128 + sig
    assert json.loads(targets.read_text()) == []
    assert "Traceback" not in err and "signal" not in err, err[-3000:]
