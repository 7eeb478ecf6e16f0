"""What `npudist deploy` generates, as keyword-only dataclasses checked when they are built."""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType

from npudist._version import __version__
from npudist.deploy.placement import NOT_YET, PLACEMENTS, Placement

SCHEDULERS = ("kubeflow", "volcano")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
# Label keys and values (Kubernetes "Labels and Selectors": optional DNS prefix, 63-character name).
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_DURATION = re.compile(r"([0-9]+(ms|s|m|h))+")
# Paths written into the sbatch script (inside double quotes, where $(...) and backticks run) and the
# systemd unit: only characters no shell or unit-file parser treats specially.
_PATH_PUNCTUATION = "/ . _ - + , = @ %"
_SCRIPT_PATH = re.compile(r"/[A-Za-z0-9/._+,=@%-]*")
_CAPABILITY = re.compile(r"(?!CAP_)[A-Z][A-Z0-9_]{1,30}")
_HOST = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?")
NAME_MAX = 40
"""Pod names are NAME-worker-INDEX and must stay within 63 characters."""


RUN_DIR_MOUNT = "/npudist-run"
"""Where the training pods mount the shared run directory; the job's own folder is RUN_DIR_MOUNT/NAME."""
RESUME_FLAGS = MappingProxyType({"examples/train_ddp.py": "--run-dir"})
"""Scripts known to checkpoint into and resume from a folder, and the flag that names it. Other scripts
find the folder in NPUDIST_RUN_DIR."""
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class DeployError(ValueError):
    """The options cannot describe a working deployment; the message names each problem and the fix."""


def image_has_tag(image: str) -> bool:
    """``name:tag`` or ``name@sha256:...``; a registry port (``host:5000/name``) is not a tag."""
    return "@" in image or ":" in image.rsplit("/", 1)[-1]


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """The training job and the exporters, whatever runs them."""

    name: str = "npudist-train"
    accelerator: str = "npu"
    nodes: int = 2
    nproc_per_node: int | None = None
    """Ranks per node; None: the accelerator row's usual device count (8 NPUs or GPUs, 2 CPU ranks)."""
    script: tuple[str, ...] = ("examples/train_ddp.py", "--steps", "100")
    """The training script and its arguments, as `npudist launch` receives them."""
    metrics_port: int = 9500
    """Rank r serves its metrics on metrics_port + local rank."""
    exporter_port: int = 9400
    rdzv_port: int = 29400
    interval: str = "5s"
    """`npudist exporter --interval`."""

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise DeployError("; ".join(problems))

    @property
    def placement(self) -> Placement:
        return PLACEMENTS[self.accelerator]

    def resuming_script(self, run_dir: str | None) -> tuple[str, ...]:
        """The script and its arguments, pointed at ``run_dir`` when the script is one that resumes from a
        folder (RESUME_FLAGS) and was not given one."""
        flag = RESUME_FLAGS.get(self.script[0]) if run_dir else None
        if flag is None or any(a == flag or a.startswith(flag + "=") for a in self.script):
            return self.script
        return (*self.script, flag, run_dir)

    @property
    def nproc(self) -> int:
        return self.nproc_per_node if self.nproc_per_node is not None else self.placement.default_nproc

    @property
    def scrape_job(self) -> str:
        """Prometheus job of the ranks: the rules select jobs named npudist* (dashboards/rules.py)."""
        return self.name if self.name.startswith("npudist") else f"npudist-{self.name}"

    def problems(self) -> list[str]:
        out = []
        if self.accelerator in NOT_YET:
            out.append(f"--accelerator {self.accelerator}: not yet ({NOT_YET[self.accelerator]}); "
                       f"deployable now: {', '.join(PLACEMENTS)}")
        elif self.accelerator not in PLACEMENTS:
            out.append(f"--accelerator {self.accelerator!r} is unknown: choose one of {', '.join(PLACEMENTS)}")
        if len(self.name) > NAME_MAX or not _DNS_LABEL.fullmatch(self.name):
            out.append(f"--name {self.name!r}: use lower-case letters, digits and '-' (at most {NAME_MAX})")
        if self.nodes < 1:
            out.append(f"--nodes {self.nodes}: a job needs at least 1 node")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            out.append(f"--nproc-per-node {self.nproc_per_node}: give at least 1 rank per node")
        if not self.script or not self.script[0].strip():
            out.append("--script is empty: give the training script (and its arguments)")
        for flag, port in (("--metrics-port", self.metrics_port), ("--exporter-port", self.exporter_port),
                           ("--rdzv-port", self.rdzv_port)):
            if not 1 <= port <= 65535:
                out.append(f"{flag} {port}: ports are 1-65535")
        from npudist.telemetry.exposition.node_exporter import ExporterError, parse_interval  # not for --help

        try:
            parse_interval(self.interval)
        except ExporterError as exc:
            out.append(str(exc))
        if not out:
            out += self._port_clashes()
        return out

    def _port_clashes(self) -> list[str]:
        ranks = range(self.metrics_port, self.metrics_port + self.nproc)
        if ranks.stop - 1 > 65535:
            return [f"--metrics-port {self.metrics_port}: {self.nproc} ranks need ports up to {ranks.stop - 1}"]
        return [f"{flag} {port} falls in the ranks' metrics ports {ranks.start}-{ranks.stop - 1}: choose another"
                for flag, port in (("--exporter-port", self.exporter_port), ("--rdzv-port", self.rdzv_port))
                if port in ranks]


def _labels(pairs: tuple[str, ...]) -> list[str]:
    bad = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            bad.append(f"--monitor-label {pair!r}: expected KEY=VALUE with a Kubernetes label key and value")
    return bad


@dataclass(frozen=True, kw_only=True)
class K8sOptions(JobOptions):
    namespace: str = "npudist"
    image: str = f"npudist:{__version__}"
    """An image with npudist, torch and the vendor's torch plugin; npudist publishes none."""
    scheduler: str = "kubeflow"
    shm_size: str | None = None
    """Size of /dev/shm per training pod; None: the accelerator row's default."""
    monitor_labels: tuple[str, ...] = ()
    """KEY=VALUE labels for the ServiceMonitor, PodMonitor and PrometheusRule (the Prometheus's selectors)."""
    scrape_interval: str = "15s"
    service_account_token: bool = False
    """Mount the service-account token into the training pods (only for scripts that call the API server)."""
    add_capabilities: tuple[str, ...] = ()
    """Linux capabilities the training container gets back after dropping all (e.g. IPC_LOCK for RDMA)."""
    max_restarts: int = 3
    """torchrun's --max-restarts, and the scheduler's retries; 0 turns restarts off."""
    run_dir_pvc: str | None = None
    """A PersistentVolumeClaim (ReadWriteMany) every training pod mounts at RUN_DIR_MOUNT."""
    run_dir_host_path: str | None = None
    """Or a host folder on a filesystem every node shares (NFS, Lustre), mounted at RUN_DIR_MOUNT."""

    @property
    def run_dir(self) -> str | None:
        """The job's folder on the shared volume: checkpoints, run logs, hang reports."""
        return f"{RUN_DIR_MOUNT}/{self.name}" if self.run_dir_pvc or self.run_dir_host_path else None

    @property
    def shm(self) -> str:
        return self.shm_size or self.placement.shm_size

    @property
    def monitor_label_map(self) -> dict[str, str]:
        return dict(pair.split("=", 1) for pair in self.monitor_labels)

    def problems(self) -> list[str]:
        out = super().problems()
        if not _DNS_LABEL.fullmatch(self.namespace) or len(self.namespace) > 63:
            out.append(f"--namespace {self.namespace!r}: use lower-case letters, digits and '-' (at most 63)")
        if not image_has_tag(self.image):
            out.append(f"--image {self.image!r} has no tag: pin one (NAME:TAG or NAME@sha256:DIGEST) so every "
                       "node runs the same build")
        if self.scheduler not in SCHEDULERS:
            out.append(f"--scheduler {self.scheduler!r} is unknown: choose one of {', '.join(SCHEDULERS)}")
        if not _DURATION.fullmatch(self.scrape_interval):
            out.append(f"--scrape-interval {self.scrape_interval!r}: give a Prometheus duration such as 15s or 1m")
        out += [f"--add-capability {c!r}: give a capability name such as IPC_LOCK (no CAP_ prefix)"
                for c in self.add_capabilities if not _CAPABILITY.fullmatch(c)]
        if self.shm_size is not None and not _QUANTITY.fullmatch(self.shm_size):
            out.append(f"--shm-size {self.shm_size!r}: give a Kubernetes quantity such as 16Gi")
        return out + _labels(self.monitor_labels) + self._run_dir_problems()

    def _run_dir_problems(self) -> list[str]:
        out = []
        if self.max_restarts < 0:
            out.append(f"--max-restarts {self.max_restarts}: give 0 (no restarts) or more")
        if self.run_dir_pvc is not None and self.run_dir_host_path is not None:
            out.append("--run-dir-pvc and --run-dir-host-path both given: choose one shared run directory")
        if self.run_dir_pvc is not None and not _DNS_SUBDOMAIN.fullmatch(self.run_dir_pvc):
            out.append(f"--run-dir-pvc {self.run_dir_pvc!r}: give a PersistentVolumeClaim name (lower-case "
                       "letters, digits, '-' and '.')")
        if self.run_dir_host_path is not None and (not _SCRIPT_PATH.fullmatch(self.run_dir_host_path)
                                                   or self.run_dir_host_path == "/"):
            out.append(f"--run-dir-host-path {self.run_dir_host_path!r}: give an absolute folder of letters, "
                       f"digits and {_PATH_PUNCTUATION}")
        if self.max_restarts > 0 and self.run_dir_pvc is None and self.run_dir_host_path is None:
            out.append(f"--max-restarts {self.max_restarts} restarts the job, but with no shared run directory "
                       "every restart starts again at step 0: give --run-dir-pvc NAME (a ReadWriteMany "
                       "PersistentVolumeClaim) or --run-dir-host-path PATH (a folder on a filesystem every node "
                       "shares), or --max-restarts 0")
        return out


@dataclass(frozen=True, kw_only=True)
class SlurmOptions(JobOptions):
    rdzv_port: int = 29500
    sd_dir: str = "/etc/prometheus/sd"
    """Folder Prometheus reads file_sd targets from; the nodes write into it, so it must be shared."""
    hosts: tuple[str, ...] = ()
    """Nodes running the exporter unit, listed in the node exporters' targets file."""
    exporter_bin: str = "/usr/local/bin/npudist"
    """The npudist executable on the nodes, for the systemd unit (ExecStart needs an absolute path)."""
    time_limit: str | None = None
    """`#SBATCH --time`; None: the partition's default (the CLI says so: it is often an hour or less)."""
    partition: str | None = None
    """`#SBATCH --partition`; None: the cluster's default partition."""
    exclusive: bool = True
    """`#SBATCH --exclusive`: the nodes are the job's alone. Ranks count on every device, the host memory and
    the network of their nodes; another job placed beside them takes a device or bandwidth they wait for."""
    run_dir: str | None = None
    """A folder every node shares (NFS, Lustre): the job checkpoints into RUN_DIR/NAME, so a resubmitted or
    requeued job resumes there."""

    @property
    def job_run_dir(self) -> str | None:
        return f"{self.run_dir.rstrip('/')}/{self.name}" if self.run_dir else None

    def problems(self) -> list[str]:
        out = super().problems()
        paths = [("--sd-dir", self.sd_dir), ("--exporter-bin", self.exporter_bin)]
        paths += [("--run-dir", self.run_dir)] if self.run_dir is not None else []
        for flag, path in paths:
            if not _SCRIPT_PATH.fullmatch(path):
                out.append(f"{flag} {path!r}: give an absolute path of letters, digits and {_PATH_PUNCTUATION} "
                           "(it is written into a shell script and a systemd unit, where $, quotes, backticks "
                           "and spaces would be expanded or split)")
        out += [f"--hosts: {h!r} is not a host name" for h in self.hosts if not _HOST.fullmatch(h)]
        if self.time_limit is not None and not re.fullmatch(r"[0-9:-]+", self.time_limit):
            out.append(f"--time {self.time_limit!r}: use Slurm's forms, e.g. 90, 4:00:00 or 2-00:00:00")
        if self.partition is not None and not re.fullmatch(r"[A-Za-z0-9_.,-]+", self.partition):
            out.append(f"--partition {self.partition!r}: give partition names (letters, digits, '_', '.', '-', "
                       "comma-separated), as `sinfo -s` lists them")
        return out
