"""`npudist deploy` on the command line: bad arguments exit 2 naming the problem, and write nothing."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from npudist.cli import app

BAD = [
    (["k8s", "--accelerator", "tpu"], "--accelerator 'tpu' is unknown: choose one of npu, cuda, cpu"),
    (["k8s", "--nodes", "0"], "--nodes 0: a job needs at least 1 node"),
    (["k8s", "--image", "registry:5000/team/npudist"], "has no tag"),
    (["k8s", "--scheduler", "yarn"], "--scheduler 'yarn' is unknown"),
    (["k8s", "--monitor-label", "release"], "expected KEY=VALUE"),
    (["k8s", "--metrics-port", "9400", "--nproc-per-node", "2", "--accelerator", "cpu"], "--exporter-port 9400"),
    (["slurm", "--accelerator", "rocm"], "--accelerator 'rocm' is unknown"),
    (["k8s", "--accelerator", "mlu"], "--accelerator mlu: not yet (no Cambricon row yet"),
    (["slurm", "--accelerator", "rknpu"], "--accelerator rknpu: not yet (RK3588 boards"),
    (["slurm", "--nodes", "-1"], "--nodes -1"),
    (["slurm", "--sd-dir", "relative/sd"], "--sd-dir 'relative/sd': give an absolute path"),
    (["slurm", "--script", "train.py 'unclosed"], "--script"),
    (["k8s"], "--max-restarts 3 restarts the job, but with no shared run directory every restart starts again "
              "at step 0: give --run-dir-pvc NAME"),
    (["k8s", "--run-dir-pvc", "Runs_1"], "--run-dir-pvc 'Runs_1': give a PersistentVolumeClaim name"),
    (["k8s", "--run-dir-pvc", "runs", "--run-dir-host-path", "/nfs/runs"], "both given: choose one"),
    (["k8s", "--run-dir-host-path", "/nfs/$(id)"], "--run-dir-host-path '/nfs/$(id)': give an absolute folder"),
    (["slurm", "--run-dir", "shared/runs"], "--run-dir 'shared/runs': give an absolute path"),
    (["slurm", "--partition", "gpu;rm"], "--partition 'gpu;rm': give partition names"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_exit_2_with_a_message(args, message, tmp_path):
    res = CliRunner().invoke(app, ["deploy", *args, "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split())
    assert not (tmp_path / "out").exists()


def test_k8s_and_slurm_write_their_files(tmp_path):
    res = CliRunner().invoke(app, ["deploy", "k8s", "--out", str(tmp_path / "k"), "--accelerator", "cuda",
                                   "--image", "registry:5000/npudist:1.0", "--scheduler", "volcano",
                                   "--run-dir-pvc", "npudist-runs"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "k" / "job-volcano.yaml").is_file() and (tmp_path / "k" / "kustomization.yaml").is_file()
    assert "registry:5000/npudist:1.0" in (tmp_path / "k" / "exporter-daemonset.yaml").read_text()
    res = CliRunner().invoke(app, ["deploy", "slurm", "--out", str(tmp_path / "s"), "--hosts", "n1"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "s" / "npudist.sbatch").stat().st_mode & 0o111


def test_slurm_asks_for_whole_nodes_and_says_which_limits_the_cluster_will_choose(tmp_path):
    """The defaults did not fit a typical cluster: no partition (the default one may have no accelerators),
    shared nodes (another job takes a device the ranks wait for) and the partition's time limit unsaid."""
    res = CliRunner().invoke(app, ["deploy", "slurm", "--out", str(tmp_path / "s"), "--hosts", "n1"])
    text, script = " ".join(res.output.split()), (tmp_path / "s" / "npudist.sbatch").read_text()
    assert "#SBATCH --exclusive\n" in script and "--partition" not in script and "--time" not in script
    assert "no --time: Slurm ends the job at the partition's default limit" in text and "no --partition" in text
    res = CliRunner().invoke(app, ["deploy", "slurm", "--out", str(tmp_path / "t"), "--hosts", "n1", "--shared",
                                   "--partition", "ascend", "--time", "24:00:00"])
    text, script = " ".join(res.output.split()), (tmp_path / "t" / "npudist.sbatch").read_text()
    assert "#SBATCH --partition=ascend\n" in script and "#SBATCH --time=24:00:00\n" in script
    assert "--exclusive" not in script and "no --time" not in text and "no --partition" not in text



def test_k8s_warns_on_the_placeholder_image_and_prints_the_next_command(tmp_path):
    res = CliRunner().invoke(app, ["deploy", "k8s", "--out", str(tmp_path / "k"), "--accelerator", "cpu",
                                   "--max-restarts", "0"])
    text = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert "is a placeholder no registry has" in text and "--image REGISTRY/NAME:TAG" in text
    assert f"next: kubectl apply --server-side -k {tmp_path / 'k'}" in text
    mine = CliRunner().invoke(app, ["deploy", "k8s", "--out", str(tmp_path / "m"), "--accelerator", "cpu",
                                    "--image", "registry:5000/npudist:1.0", "--run-dir-host-path", "/shared/runs"])
    assert "placeholder" not in mine.output and "kubectl apply --server-side -k" in " ".join(mine.output.split())
