"""`npudist deploy slurm`: the sbatch script trains for real under a fake srun; the rest passes Slurm's,
Prometheus's and systemd's own checkers."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys

import pytest
import yaml

from npudist.dashboards.rules import JOB_MATCH
from npudist.deploy import PLACEMENTS, SlurmOptions, write_files
from npudist.deploy.slurm import NODE_TARGETS, PROMETHEUS, SBATCH, UNIT, files, prometheus_config
from tests.conftest import REPO, child_env, fakes_path, free_ports


def _directives(script: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"^#SBATCH --([a-z-]+)=(.*)$", script, re.M))


@pytest.mark.subprocess
@pytest.mark.parametrize("accelerator", list(PLACEMENTS))
def test_sbatch_parses_and_asks_for_the_layout(accelerator, tmp_path):
    script = files(SlurmOptions(accelerator=accelerator, nodes=4, nproc_per_node=8, time_limit="1:00:00"))[SBATCH]
    (tmp_path / "job.sbatch").write_text(script)
    res = subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")], capture_output=True, text=True, timeout=30,
                         check=False)
    assert res.returncode == 0, res.stderr
    d = _directives(script)
    assert (d["nodes"], d["ntasks-per-node"], d["time"]) == ("4", "8", "1:00:00")
    gres = PLACEMENTS[accelerator].slurm_gres
    assert d.get("gres") == (f"{gres}:8" if gres else None)


@pytest.mark.e2e
def test_sbatch_trains_two_cpu_ranks_under_a_fake_srun(tmp_path):
    """srun starts 2 tasks; each runs `npudist launch --mpi`, which maps the Slurm variables to torch's."""
    _train_under_fake_srun(tmp_path)


@pytest.mark.subprocess
def test_fake_srun_runs_under_the_tests_python_whatever_the_machines_path_holds(tmp_path, monkeypatch):
    """A `python3` and an `npudist` early on the inherited PATH (a pyenv shim, an earlier `make demo`) must
    stand in neither for the interpreter of the `#!/usr/bin/env python3` fakes nor for the recording shim."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    for name in ("python3", "npudist"):
        exe = decoy / name
        exe.write_text(f'#!/bin/sh\necho "decoy {name} ran" >> {tmp_path}/decoy.log\nexit 97\n')
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{decoy}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "job").mkdir()
    _train_under_fake_srun(tmp_path / "job")
    assert not (tmp_path / "decoy.log").exists()


def _train_under_fake_srun(tmp_path):
    base, rdzv = free_ports(2, "0.0.0.0"), free_ports(1, "0.0.0.0")
    sd = tmp_path / "sd"
    opts = SlurmOptions(accelerator="cpu", nodes=1, nproc_per_node=2, metrics_port=base, rdzv_port=rdzv,
                        sd_dir=str(sd), script=("examples/train_ddp.py", "--steps", "6", "--log-every", "3",
                                                "--exchange-every", "3", "--every-rank-done"))
    write_files(tmp_path / "out", files(opts), frozenset({SBATCH}))
    # `npudist` on PATH as an installed entry point would be; it records each task's arguments.
    shim = tmp_path / "bin" / "npudist"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {tmp_path}/argv.log\nexec {sys.executable} -m npudist "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    sd.mkdir()
    (sd / "npudist-job-4242-othernode.json").write_text("[]")  # another node of this job: removed at the end
    (sd / "npudist-job-77-node9.json").write_text("[]")  # another job's: kept
    d = _directives((tmp_path / "out" / SBATCH).read_text())
    sbatch_env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_NNODES": d["nodes"],
                  "SLURM_NTASKS_PER_NODE": d["ntasks-per-node"],
                  "SLURM_NTASKS": str(int(d["nodes"]) * int(d["ntasks-per-node"])), "FAKE_SRUN_TIMEOUT": "200",
                  "PATH": fakes_path(shim.parent)}
    res = subprocess.run(["bash", str(tmp_path / "out" / SBATCH)], env=child_env(sbatch_env), cwd=REPO,
                         capture_output=True, text=True, timeout=240, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "rank=0 done steps=6" in res.stdout and "rank=1 done steps=6" in res.stdout
    assert "world=2 accelerator=cpu backend=gloo" in res.stdout
    calls = (tmp_path / "argv.log").read_text().splitlines()
    assert len(calls) == 2
    want = f"--targets-file {sd}/npudist-job-4242-{socket.gethostname()}.json"
    assert all(c.startswith(f"launch --mpi --metrics-port {base} {want} examples/train_ddp.py") for c in calls)
    assert sorted(p.name for p in sd.iterdir()) == ["npudist-job-77-node9.json"]


@pytest.mark.subprocess
def test_prometheus_config_passes_promtool_and_names_one_job_per_slurm_job(tmp_path):
    opts = SlurmOptions(hosts=("gpu01", "gpu02"), sd_dir=str(tmp_path / "sd"))
    write_files(tmp_path, files(opts))
    promtool = shutil.which("promtool")
    if promtool is not None:
        res = subprocess.run([promtool, "check", "config", str(tmp_path / PROMETHEUS)], capture_output=True,
                             text=True, timeout=60, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads((tmp_path / NODE_TARGETS).read_text()) == [
        {"targets": ["gpu01:9400", "gpu02:9400"], "labels": {}}]
    relabel = prometheus_config(opts)["scrape_configs"][0]["relabel_configs"][0]
    # Prometheus anchors relabel regexes; the file name is the one the sbatch script gives launch.
    m = re.fullmatch(relabel["regex"], f"{opts.sd_dir}/npudist-job-4242-gpu01.json")
    job = m.expand(relabel["replacement"].replace("$1", r"\1"))
    assert job == "npudist-slurm-4242" and re.fullmatch(JOB_MATCH.split('"')[1], job)
    assert yaml.safe_load((tmp_path / PROMETHEUS).read_text())["rule_files"] == ["rules.yml"]
    if promtool is None:
        pytest.skip("promtool (Debian prometheus) not installed; .ci/run installs it")


@pytest.mark.subprocess
@pytest.mark.parametrize("accelerator", ["npu", "cpu"])
def test_systemd_unit_verifies_and_runs_as_root_only_for_npu_smi(accelerator, tmp_path):
    exe = tmp_path / "npudist"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    unit = files(SlurmOptions(accelerator=accelerator, exporter_bin=str(exe)))[UNIT]
    lines = unit.splitlines()
    assert f"ExecStart={exe} exporter --listen 0.0.0.0:9400 --source {PLACEMENTS[accelerator].telemetry_source} " \
           "--interval 5s" in lines
    if PLACEMENTS[accelerator].privileged_because:
        at = lines.index("User=root")
        assert lines[at - 1].startswith("# npu-smi")
    else:
        assert "DynamicUser=yes" in lines and "User=root" not in lines
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    (tmp_path / "npudist-exporter.service").write_text(unit)
    res = subprocess.run([analyze, "verify", str(tmp_path / "npudist-exporter.service")], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0 and "Unknown" not in res.stderr, res.stderr


@pytest.mark.parametrize(("flag", "value"), [("sd_dir", "/shared/sd/$(touch /tmp/pwned)"),
                                             ("sd_dir", "/shared/`touch /tmp/pwned`"), ("sd_dir", '/sd/"x'),
                                             ("sd_dir", "/sd/${HOME}"), ("exporter_bin", "/usr/bin/npu dist"),
                                             ("exporter_bin", "/usr/bin/npudist;reboot")])
def test_paths_written_into_the_script_cannot_run_code(flag, value):
    from npudist.deploy.options import DeployError

    with pytest.raises(DeployError, match=f"--{flag.replace('_', '-')} .*written into a shell script"):
        SlurmOptions(**{flag: value})


@pytest.mark.subprocess
def test_the_sd_dir_reaches_the_ranks_verbatim(tmp_path):
    sd = "/shared/prom_sd/team-a,b=c@d%e+f.g"
    script = files(SlurmOptions(sd_dir=sd))[SBATCH]
    line = next(x for x in script.splitlines() if x.startswith("export NPUDIST_SD_DIR="))
    res = subprocess.run(["bash", "-c", f"set -u; {line}; printf %s \"$NPUDIST_SD_DIR\""], capture_output=True,
                         text=True, timeout=30, check=False, env={"PATH": os.defpath})
    assert res.stdout == sd, res.stderr
