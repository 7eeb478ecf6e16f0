"""`npudist deploy` with restarts: every training pod mounts one shared run directory and the job checkpoints
there, so a restarted pod, on whatever node, resumes; the manifests are validated offline (no cluster), and the
Slurm script's resubmission is run for real under the fake srun and seen to resume."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from npudist.deploy import K8sOptions, SlurmOptions, write_files
from npudist.deploy.k8s import files as k8s_files
from npudist.deploy.options import RUN_DIR_MOUNT
from npudist.deploy.slurm import SBATCH
from npudist.deploy.slurm import files as slurm_files
from npudist.launch import parser
from tests.conftest import REPO, child_env, fakes_path, free_ports
from tests.deploy.schemas import pod_templates, validate

KINDS = {"kubeflow": "PyTorchJob", "volcano": "Job"}


def _job(opts: K8sOptions) -> dict:
    text = k8s_files(opts)[{"kubeflow": "job-pytorchjob.yaml", "volcano": "job-volcano.yaml"}[opts.scheduler]]
    job = yaml.safe_load(text)
    assert job["kind"] == KINDS[opts.scheduler]
    validate(job)  # the CRD's own schema, closed against misspelt fields
    return job


@pytest.mark.parametrize("scheduler", list(KINDS))
@pytest.mark.parametrize(("source", "volume"), [
    ({"run_dir_pvc": "npudist-runs"}, {"persistentVolumeClaim": {"claimName": "npudist-runs"}}),
    ({"run_dir_host_path": "/nfs/runs"}, {"hostPath": {"path": "/nfs/runs", "type": "DirectoryOrCreate"}}),
])
def test_every_pod_mounts_the_shared_run_directory_and_resumes_from_it(scheduler, source, volume):
    job = _job(K8sOptions(scheduler=scheduler, nodes=3, name="llm", **source))
    where = f"{RUN_DIR_MOUNT}/llm"
    templates = pod_templates(job)
    assert len(templates) == 2  # master and workers: the same volume in each
    for template in templates:
        (c,) = template["spec"]["containers"]
        assert {"name": "run-dir", **volume} in template["spec"]["volumes"]
        assert {"name": "run-dir", "mountPath": RUN_DIR_MOUNT} in c["volumeMounts"]
        assert {"name": "NPUDIST_RUN_DIR", "value": where} in c["env"]
        ns = parser().parse_args(c["args"])
        assert ns.max_restarts == 3
        # the example checkpoints into and resumes from --run-dir, on the shared volume
        assert ns.training_script == "examples/train_ddp.py"
        assert ns.training_script_args == ["--steps", "100", "--run-dir", where]
        assert template["spec"]["restartPolicy"] == {"kubeflow": "OnFailure", "volcano": "Never"}[scheduler]
    if scheduler == "volcano":
        assert job["spec"]["maxRetry"] == 3


def test_a_scripts_own_run_dir_is_kept_and_other_scripts_get_the_variable():
    mine = _job(K8sOptions(run_dir_pvc="runs", script=("examples/train_ddp.py", "--run-dir=/elsewhere")))
    (c,) = pod_templates(mine)[0]["spec"]["containers"]
    assert parser().parse_args(c["args"]).training_script_args == ["--run-dir=/elsewhere"]
    other = _job(K8sOptions(run_dir_pvc="runs", script=("train.py", "--lr", "1")))
    (c,) = pod_templates(other)[0]["spec"]["containers"]
    assert parser().parse_args(c["args"]).training_script_args == ["--lr", "1"]
    assert {"name": "NPUDIST_RUN_DIR", "value": f"{RUN_DIR_MOUNT}/npudist-train"} in c["env"]


def test_without_restarts_no_run_directory_is_needed_and_no_pod_restarts():
    job = _job(K8sOptions(max_restarts=0))
    for template in pod_templates(job):
        assert template["spec"]["restartPolicy"] == "Never"
        assert not [v for v in template["spec"]["volumes"] if v["name"] == "run-dir"]
        assert "--max-restarts" in (args := template["spec"]["containers"][0]["args"])
        assert args[args.index("--max-restarts") + 1] == "0"
    assert all(r["restartPolicy"] == "Never" for r in job["spec"]["pytorchReplicaSpecs"].values())


def _sbatch(tmp_path, steps: int, shared) -> subprocess.CompletedProcess[str]:
    base, rdzv = free_ports(1, "0.0.0.0"), free_ports(1, "0.0.0.0")
    opts = SlurmOptions(accelerator="cpu", nodes=1, nproc_per_node=1, metrics_port=base, rdzv_port=rdzv,
                        sd_dir=str(tmp_path / "sd"), run_dir=str(shared), name="resumes",
                        script=("examples/train_ddp.py", "--steps", str(steps), "--log-every", "1",
                                "--exchange-every", "100"))
    out = tmp_path / f"out{steps}"
    write_files(out, slurm_files(opts), frozenset({SBATCH}))
    shim = tmp_path / "bin" / "npudist"
    if not shim.exists():
        shim.parent.mkdir()
        shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m npudist "$@"\n')
        shim.chmod(0o755)
    env = {"SLURM_JOB_ID": str(steps), "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_NNODES": "1",
           "SLURM_NTASKS_PER_NODE": "1", "SLURM_NTASKS": "1", "FAKE_SRUN_TIMEOUT": "200",
           "PATH": fakes_path(shim.parent)}
    return subprocess.run(["bash", str(out / SBATCH)], env=child_env(env), cwd=REPO, capture_output=True,
                          text=True, timeout=240, check=False)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_resubmitted_slurm_job_resumes_from_the_shared_run_directory(tmp_path):
    shared = tmp_path / "shared"
    first = _sbatch(tmp_path, 2, shared)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "resumed from" not in first.stdout and (shared / "resumes").is_dir()
    second = _sbatch(tmp_path, 3, shared)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"resumed from step=2 run_dir={shared}/resumes" in second.stdout
    assert "rank=0 done steps=3" in second.stdout


def test_the_slurm_script_without_a_run_dir_says_so(tmp_path):
    script = slurm_files(SlurmOptions())[SBATCH]
    assert "No --run-dir" in script and "--run-dir" not in script.split("srun ", 1)[1]
    script = slurm_files(SlurmOptions(run_dir="/lustre/runs/"))[SBATCH]
    assert "export NPUDIST_RUN_DIR=/lustre/runs/npudist-train" in script
    assert script.rstrip().endswith("examples/train_ddp.py --steps 100 --run-dir /lustre/runs/npudist-train")
