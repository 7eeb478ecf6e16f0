"""``npudist deploy k8s|slurm``: the typer group cli.py registers."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from npudist._version import __version__

app = typer.Typer(no_args_is_help=True, help="Generate cluster deployments: Kubernetes manifests or a Slurm job.")
err = Console(stderr=True, soft_wrap=True)  # a path or command in a message stays whole, to copy
DEFAULT_IMAGE = f"npudist:{__version__}"

Out = Annotated[Path, typer.Option("--out", help="Folder to write into (created; files replaced).")]
Accel = Annotated[str, typer.Option(help="npu, cuda or cpu: node selector, resource and host mounts.")]
Nodes = Annotated[int, typer.Option(help="Nodes (pods or Slurm nodes) in the job.")]
Nproc = Annotated[int | None, typer.Option(help="Ranks per node (default: 8 on npu and cuda, 2 on cpu).")]
Script = Annotated[str, typer.Option(help="Training script and its arguments, as one shell-quoted string.")]
Name = Annotated[str, typer.Option(help="Job name (pods, services, Slurm job).")]
MetricsPort = Annotated[int, typer.Option(help="Rank r serves metrics on this port + local rank.")]
ExporterPort = Annotated[int, typer.Option(help="`npudist exporter` port on every node.")]


def _generate(command: str, build, out: Path) -> None:
    from npudist.deploy import DeployError, write_files

    try:
        files, executable, notes = build()
    except DeployError as exc:
        err.print(f"[bold red]npudist deploy {command}:[/] {exc}")
        raise typer.Exit(2) from None
    try:
        written = write_files(out, files, executable)
    except OSError as exc:
        err.print(f"[bold red]npudist deploy {command}:[/] cannot write under {out}: {exc}")
        raise typer.Exit(2) from None
    for path in written:
        typer.echo(str(path))
    for note in notes:
        err.print(f"[yellow]note:[/] {note}")


def _script(text: str) -> tuple[str, ...]:
    from npudist.deploy import DeployError

    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise DeployError(f"--script {text!r}: {exc}") from None


@app.command("k8s", help="Write Kubernetes YAML and a kustomization.yaml: exporter DaemonSet, Service, "
             "ServiceMonitor, PrometheusRule, dashboard ConfigMaps, and the training job with its PodMonitor. "
             "Example: `npudist deploy k8s --out k8s --accelerator npu --nodes 2 --image REGISTRY/npudist:TAG "
             "--run-dir-pvc npudist-runs`.")
def k8s_cmd(
    out: Out,
    namespace: str = typer.Option("npudist", help="Namespace of every object."),
    accelerator: Accel = "npu",
    image: str = typer.Option(DEFAULT_IMAGE, help="Image with npudist, torch and the vendor's torch plugin, with a "
                              "tag, in a registry your nodes pull from (npudist publishes none: the default "
                              "is a placeholder, and deploy warns)."),
    nodes: Nodes = 2,
    nproc_per_node: Nproc = None,
    scheduler: str = typer.Option("kubeflow", help="kubeflow (PyTorchJob) or volcano (Volcano Job)."),
    script: Script = "examples/train_ddp.py --steps 100",
    name: Name = "npudist-train",
    shm_size: str | None = typer.Option(None, help="/dev/shm per pod (default: 16Gi; 1Gi on cpu)."),
    monitor_label: Annotated[list[str] | None, typer.Option(
        help="KEY=VALUE on the monitors and rules, for the Prometheus's selectors (repeatable).")] = None,
    metrics_port: MetricsPort = 9500,
    exporter_port: ExporterPort = 9400,
    rdzv_port: int = typer.Option(29400, help="c10d rendezvous port on the master pod."),
    service_account_token: bool = typer.Option(False, help="Mount the service-account token into the training "
                                               "pods (only for scripts that call the Kubernetes API)."),
    add_capability: Annotated[list[str] | None, typer.Option(
        help="Linux capability the training container keeps after dropping all, e.g. IPC_LOCK for RDMA "
             "(repeatable).")] = None,
    max_restarts: int = typer.Option(3, help="Restarts after a failure (torchrun's and the scheduler's); each "
                                     "resumes from the shared run directory. 0: none."),
    run_dir_pvc: str | None = typer.Option(None, help="PersistentVolumeClaim (ReadWriteMany) holding the shared "
                                           "run directory; required with restarts unless --run-dir-host-path."),
    run_dir_host_path: str | None = typer.Option(None, help="Or a folder on a filesystem every node shares (NFS, "
                                                 "Lustre), mounted as the run directory."),
) -> None:
    def build():
        from npudist.deploy import K8sOptions
        from npudist.deploy.k8s import files

        opts = K8sOptions(namespace=namespace, accelerator=accelerator, image=image, nodes=nodes,
                          nproc_per_node=nproc_per_node, scheduler=scheduler, script=_script(script), name=name,
                          shm_size=shm_size, monitor_labels=tuple(monitor_label or ()), metrics_port=metrics_port,
                          exporter_port=exporter_port, rdzv_port=rdzv_port,
                          service_account_token=service_account_token,
                          add_capabilities=tuple(add_capability or ()), max_restarts=max_restarts,
                          run_dir_pvc=run_dir_pvc, run_dir_host_path=run_dir_host_path)
        notes = []
        if image == DEFAULT_IMAGE:
            notes.append(f"--image {DEFAULT_IMAGE} is a placeholder no registry has: the pods will not start "
                         "(ImagePullBackOff). Build an image with npudist, torch and your vendor's plugin, push "
                         "it, and pass --image REGISTRY/NAME:TAG")
        notes.append(f"next: kubectl apply --server-side -k {out}   (then: kubectl -n {namespace} get pods -w)")
        return files(opts), frozenset(), tuple(notes)

    _generate("k8s", build, out)


@app.command("slurm", help="Write an sbatch script (srun + `npudist launch --mpi`), a Prometheus config with "
             "file_sd targets, and the exporter as a systemd unit. Example: `npudist deploy slurm --out slurm "
             "--nodes 2 --partition gpu --time 24:00:00 --run-dir /shared/runs`.")
def slurm_cmd(
    out: Out,
    accelerator: Accel = "npu",
    nodes: Nodes = 2,
    nproc_per_node: Nproc = None,
    script: Script = "examples/train_ddp.py --steps 100",
    name: Name = "npudist-train",
    hosts: Annotated[list[str] | None, typer.Option(
        help="A node running the exporter unit, for Prometheus's targets (repeatable).")] = None,
    sd_dir: str = typer.Option("/etc/prometheus/sd", help="Shared folder Prometheus reads file_sd targets from."),
    exporter_bin: str = typer.Option("/usr/local/bin/npudist", help="npudist's absolute path on the nodes."),
    time_limit: str | None = typer.Option(None, "--time", help="#SBATCH --time (e.g. 4:00:00); default: the "
                                          "partition's limit, often an hour or less."),
    partition: str | None = typer.Option(None, "--partition", help="#SBATCH --partition (default: the cluster's "
                                         "default partition)."),
    exclusive: bool = typer.Option(True, "--exclusive/--shared", help="Whole nodes for the job (#SBATCH "
                                   "--exclusive), or share them with other jobs."),
    metrics_port: MetricsPort = 9500,
    exporter_port: ExporterPort = 9400,
    rdzv_port: int = typer.Option(29500, help="MASTER_PORT on rank 0's node (the job's MASTER_PORT wins)."),
    run_dir: str | None = typer.Option(None, help="A folder every node shares: the job checkpoints into "
                                       "RUN_DIR/NAME and a resubmitted or requeued job resumes there."),
) -> None:
    def build():
        from npudist.deploy import SlurmOptions
        from npudist.deploy.slurm import NODE_TARGETS, SBATCH, files

        opts = SlurmOptions(accelerator=accelerator, nodes=nodes, nproc_per_node=nproc_per_node,
                            script=_script(script), name=name, hosts=tuple(hosts or ()), sd_dir=sd_dir,
                            exporter_bin=exporter_bin, time_limit=time_limit, metrics_port=metrics_port,
                            exporter_port=exporter_port, rdzv_port=rdzv_port, run_dir=run_dir,
                            partition=partition, exclusive=exclusive)
        notes = () if opts.hosts else (f"no --hosts: {NODE_TARGETS} lists no node exporters yet",)
        if time_limit is None:
            notes += ("no --time: Slurm ends the job at the partition's default limit (`sinfo -o '%P %l'` "
                      "shows it; often an hour or less); give --time 24:00:00 or what the run needs",)
        if partition is None:
            notes += ("no --partition: the cluster's default partition, which may have no accelerators; "
                      "`sinfo -s` lists them",)
        if run_dir is None:
            notes += ("no --run-dir: a resubmitted job starts again at step 0; give a folder every node shares",)
        return files(opts), frozenset({SBATCH}), notes

    _generate("slurm", build, out)
