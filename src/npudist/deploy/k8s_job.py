"""The training job on Kubernetes: a Kubeflow PyTorchJob or a Volcano Job running `npudist launch`, and the
PodMonitor that scrapes every rank.

One master pod (hosting torchrun's c10d rendezvous store) and nodes - 1 worker pods; each runs
`npudist launch` with --nproc-per-node ranks, which serve metrics on metrics_port + local rank.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from npudist.deploy.k8s_exporter import ALL_INTERFACES
from npudist.deploy.manifest import SCRAPE_JOB_LABEL, host_volumes, job_labels, meta, node_name_env, render
from npudist.deploy.options import RUN_DIR_MOUNT, K8sOptions
from npudist.runtime.settings import HOST_VAR, RUN_DIR_VAR

RUN_DIR_VOLUME = "run-dir"


@dataclass(frozen=True)
class Scheduler:
    file: str
    kind: str
    master_host: Callable[[K8sOptions], str]
    """DNS name of the master pod, which the operator's headless Service publishes."""
    rdzv_port_name: str
    restart_policy: str
    build: Callable[[K8sOptions, dict[str, dict[str, Any]]], dict[str, Any]]
    """(options, role -> pod template) -> the job object."""


def _metrics_ports(opts: K8sOptions) -> list[dict[str, Any]]:
    # Named ports (at most 15 characters) so the PodMonitor can list one endpoint per local rank.
    return [{"name": f"metrics-r{i}", "containerPort": opts.metrics_port + i, "protocol": "TCP"}
            for i in range(opts.nproc)]


def launch_args(opts: K8sOptions, rdzv_host: str, is_host: bool) -> list[str]:
    """`npudist launch` arguments; ``is_host`` says outright which pod hosts the c10d store instead of
    leaving torchrun to guess it from the pod's hostname and addresses."""
    return ["--nnodes", str(opts.nodes), "--nproc-per-node", str(opts.nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{rdzv_host}:{opts.rdzv_port}", "--rdzv-id", opts.name,
            "--rdzv-conf", f"is_host={str(is_host).lower()}", "--max-restarts", str(opts.max_restarts),
            "--metrics-port", str(opts.metrics_port), *opts.resuming_script(opts.run_dir)]


def _run_dir_volume(opts: K8sOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, str]]]:
    """(volumes, mounts, env) for the shared run directory: a restarted pod, on whatever node, finds the
    checkpoints its predecessor wrote there (NPUDIST_RUN_DIR for scripts; --run-dir for the example)."""
    if opts.run_dir is None:
        return [], [], []
    source = ({"persistentVolumeClaim": {"claimName": opts.run_dir_pvc}} if opts.run_dir_pvc else
              {"hostPath": {"path": opts.run_dir_host_path, "type": "DirectoryOrCreate"}})
    return ([{"name": RUN_DIR_VOLUME, **source}], [{"name": RUN_DIR_VOLUME, "mountPath": RUN_DIR_MOUNT}],
            [{"name": RUN_DIR_VAR, "value": opts.run_dir}])


def _restart_policy(opts: K8sOptions, sched: Scheduler) -> str:
    return sched.restart_policy if opts.max_restarts > 0 else "Never"


def _container_security(opts: K8sOptions) -> dict[str, Any]:
    """Kubernetes' "restricted" Pod Security Standard for what training needs none of: no privilege
    escalation, no capabilities (unless asked back), the runtime's seccomp profile (set on the pod).
    Devices come from the device plugin's allocation, which needs no privilege in the container."""
    caps: dict[str, list[str]] = {"drop": ["ALL"]}
    if opts.add_capabilities:
        caps["add"] = list(opts.add_capabilities)
    return {"allowPrivilegeEscalation": False, "capabilities": caps}


def pod_template(opts: K8sOptions, sched: Scheduler, is_host: bool) -> dict[str, Any]:
    row = opts.placement
    volumes, mounts = host_volumes(row.job_mounts)
    volumes.insert(0, {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": opts.shm}})
    mounts.insert(0, {"name": "dshm", "mountPath": "/dev/shm"})
    run_volumes, run_mounts, run_env = _run_dir_volume(opts)
    volumes += run_volumes
    mounts += run_mounts
    devices = {row.resource: str(opts.nproc)} if row.resource else {}
    container = {
        "name": "pytorch",  # the name the Kubeflow training operator requires
        "image": opts.image,
        "command": ["npudist", "launch"],
        "args": launch_args(opts, sched.master_host(opts), is_host),
        "env": [{"name": HOST_VAR, "value": ALL_INTERFACES}, node_name_env(), *run_env],
        "ports": [{"name": sched.rdzv_port_name, "containerPort": opts.rdzv_port, "protocol": "TCP"},
                  *_metrics_ports(opts)],
        "resources": {"requests": dict(devices), "limits": dict(devices)},
        "volumeMounts": mounts,
        "securityContext": _container_security(opts),
    }
    labels = {**job_labels(opts), SCRAPE_JOB_LABEL: opts.scrape_job}
    return {"metadata": {"labels": labels},
            "spec": {"restartPolicy": _restart_policy(opts, sched), "nodeSelector": dict(row.node_selector),
                     "tolerations": [dict(t) for t in row.tolerations], "containers": [container],
                     "volumes": volumes, "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                     "automountServiceAccountToken": opts.service_account_token}}


def _roles(opts: K8sOptions) -> dict[str, int]:
    return {"master": 1, **({"worker": opts.nodes - 1} if opts.nodes > 1 else {})}


def _pytorchjob(opts: K8sOptions, templates: dict[str, dict[str, Any]]) -> dict[str, Any]:
    # Kubeflow training operator v1: replica types Master and Worker; the operator creates a headless
    # Service per pod, named <job>-<type>-<index>.
    policy = _restart_policy(opts, SCHEDULERS["kubeflow"])
    specs = {role.capitalize(): {"replicas": count, "restartPolicy": policy, "template": templates[role]}
             for role, count in _roles(opts).items()}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta(opts.name, opts, job_labels(opts)),
            "spec": {"pytorchReplicaSpecs": specs}}


def _volcano_job(opts: K8sOptions, templates: dict[str, dict[str, Any]]) -> dict[str, Any]:
    # Volcano's svc plugin makes a headless Service named after the job and gives pod i of task T the
    # hostname <job>-<T>-<i> under it; publishing not-ready addresses lets workers resolve the master early.
    tasks = [{"name": role, "replicas": count, "template": templates[role]} for role, count in _roles(opts).items()]
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": meta(opts.name, opts, job_labels(opts)),
            "spec": {"schedulerName": "volcano", "minAvailable": opts.nodes, "queue": "default",
                     "maxRetry": opts.max_restarts,
                     "plugins": {"svc": ["--publish-not-ready-addresses"], "env": []},
                     "policies": [{"event": "PodEvicted", "action": "RestartJob"},
                                  {"event": "PodFailed", "action": "RestartJob"}],
                     "tasks": tasks}}


SCHEDULERS: Mapping[str, Scheduler] = MappingProxyType({
    "kubeflow": Scheduler("job-pytorchjob.yaml", "Kubeflow PyTorchJob", lambda o: f"{o.name}-master-0",
                          "pytorchjob-port", "OnFailure", _pytorchjob),
    "volcano": Scheduler("job-volcano.yaml", "Volcano Job", lambda o: f"{o.name}-master-0.{o.name}",
                         "rdzv", "Never", _volcano_job),
})


def job(opts: K8sOptions) -> dict[str, Any]:
    sched = SCHEDULERS[opts.scheduler]
    templates = {role: pod_template(opts, sched, is_host=role == "master") for role in _roles(opts)}
    return sched.build(opts, templates)


def pod_monitor(opts: K8sOptions) -> dict[str, Any]:
    """One endpoint per local rank; the job label comes from the pods' npudist-scrape-job label."""
    labels = job_labels(opts)
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": meta(f"{opts.name}-ranks", opts, {**labels, **opts.monitor_label_map}),
            "spec": {"jobLabel": SCRAPE_JOB_LABEL, "selector": {"matchLabels": labels},
                     "namespaceSelector": {"matchNames": [opts.namespace]},
                     "podMetricsEndpoints": [{"port": p["name"], "path": "/metrics", "interval": opts.scrape_interval}
                                             for p in _metrics_ports(opts)]}}


def network_policy(opts: K8sOptions) -> dict[str, Any]:
    """The job's pods accept traffic from each other only, plus Prometheus on the metrics ports.

    The c10d rendezvous store trusts whoever reaches it: anyone who connects to the rendezvous port can
    set the keys every rank reads, the control counter that aborts them all included (docs/reference/security.md).
    Collective traffic (gloo, NCCL sockets) uses ports chosen at run time, so peers are allowed on any port.
    """
    labels = job_labels(opts)
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": meta(f"{opts.name}-job-private", opts, labels),
            "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": labels}}]},
                                 {"ports": [{"port": p["containerPort"], "protocol": "TCP"}
                                            for p in _metrics_ports(opts)]}]}}


def files(opts: K8sOptions) -> dict[str, str]:
    sched = SCHEDULERS[opts.scheduler]
    return {
        sched.file: render(job(opts), f"The training job ({sched.kind}): {opts.nodes} pod(s) x {opts.nproc} "
                           f"rank(s) of `npudist launch`, c10d rendezvous on the master pod; "
                           + (f"up to {opts.max_restarts} restart(s)" if opts.max_restarts else "no restarts")
                           + (f", checkpoints in {opts.run_dir} on the shared run directory, where a restart "
                              "resumes." if opts.run_dir else ".")),
        "job-podmonitor.yaml": render(pod_monitor(opts), "Scrapes every rank's metrics (step time, skew, "
                                      "collectives) while the job runs."),
        "job-networkpolicy.yaml": render(network_policy(opts), "Keeps the rendezvous store job-private: only "
                                         "the job's own pods reach it; Prometheus reaches the metrics ports. "
                                         "Needs a network plugin that enforces NetworkPolicy (Calico, Cilium)."),
    }
