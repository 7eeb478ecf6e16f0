"""The node exporter on Kubernetes: a DaemonSet running `npudist exporter`, its Service and ServiceMonitor."""

from __future__ import annotations

from typing import Any

from npudist.deploy.manifest import EXPORTER, exporter_labels, host_volumes, meta, node_name_env, render
from npudist.deploy.options import K8sOptions

ALL_INTERFACES = "0.0.0.0"
"""`npudist exporter` binds 127.0.0.1 unless told otherwise (telemetry/exposition/server.py); in a pod Prometheus
scrapes the pod's address, so the manifests ask for every interface explicitly."""

# Manifest fragments are built per call: each manifest is a fresh document.
def _resources() -> dict[str, Any]:
    # Measured (2026-12-04, torch 2.13 CPU wheel, fake npu-smi, 1 s reads, scraped every second for 40 s):
    # 242 MB resident, 296 MB peak while npu-smi floods its output (toolrun caps each stream at 4 MiB).
    # A CUDA or torch_npu torch import adds to that (about 526 MiB reported with one): the limit leaves
    # twice that as margin, so the kubelet never OOM-kills a healthy exporter.
    return {"requests": {"cpu": "50m", "memory": "320Mi"}, "limits": {"cpu": "500m", "memory": "1Gi"}}


def _unprivileged_pod() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534, "seccompProfile": {"type": "RuntimeDefault"}}


def _container_security(privileged: bool) -> dict[str, Any]:
    if privileged:
        return {"privileged": True, "runAsUser": 0, "runAsNonRoot": False, "readOnlyRootFilesystem": True}
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def _probe(**timing: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/metrics", "port": "metrics"}, "timeoutSeconds": 10, **timing}


def daemonset(opts: K8sOptions) -> dict[str, Any]:
    row = opts.placement
    volumes, mounts = host_volumes(row.exporter_mounts)
    volumes.append({"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}})  # the root filesystem is read-only
    mounts.append({"name": "tmp", "mountPath": "/tmp"})
    privileged = row.privileged_because is not None
    container = {
        "name": "exporter",
        "image": opts.image,
        "command": ["npudist", "exporter"],
        "args": ["--listen", f"{ALL_INTERFACES}:{opts.exporter_port}", "--source", row.telemetry_source,
                 "--interval", opts.interval],
        "env": [node_name_env(), *({"name": k, "value": v} for k, v in row.exporter_env.items())],
        "ports": [{"name": "metrics", "containerPort": opts.exporter_port, "protocol": "TCP"}],
        # torch's import makes the first answer take seconds: the startup probe gives it a minute.
        "startupProbe": _probe(periodSeconds=5, failureThreshold=12),
        "livenessProbe": _probe(periodSeconds=30, failureThreshold=3),
        "readinessProbe": _probe(periodSeconds=15),
        "resources": _resources(),
        "securityContext": _container_security(privileged),
        "volumeMounts": mounts,
    }
    pod = {"nodeSelector": dict(row.node_selector), "tolerations": [dict(t) for t in row.tolerations],
           "automountServiceAccountToken": False, "containers": [container], "volumes": volumes}
    if not privileged:
        pod["securityContext"] = _unprivileged_pod()
    labels = exporter_labels()
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta(EXPORTER, opts, labels),
            "spec": {"selector": {"matchLabels": labels}, "updateStrategy": {"type": "RollingUpdate"},
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}


def service(opts: K8sOptions) -> dict[str, Any]:
    """Headless: it only lists the exporter pods for the ServiceMonitor (Prometheus scrapes each pod)."""
    labels = exporter_labels()
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(EXPORTER, opts, labels),
            "spec": {"clusterIP": "None", "selector": labels,
                     "ports": [{"name": "metrics", "port": opts.exporter_port, "targetPort": "metrics",
                                "protocol": "TCP"}]}}


def service_monitor(opts: K8sOptions) -> dict[str, Any]:
    """Prometheus Operator scrape config; its job label is the Service's name, which the rules select."""
    labels = {**exporter_labels(), **opts.monitor_label_map}
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": meta(EXPORTER, opts, labels),
            "spec": {"selector": {"matchLabels": exporter_labels()},
                     "namespaceSelector": {"matchNames": [opts.namespace]},
                     "endpoints": [{"port": "metrics", "path": "/metrics", "interval": opts.scrape_interval}]}}


def files(opts: K8sOptions) -> dict[str, str]:
    row = opts.placement
    comments = {"privileged: true": row.privileged_because} if row.privileged_because else {}
    return {
        "exporter-daemonset.yaml": render(
            daemonset(opts), f"`npudist exporter` on every {row.accelerator} node: device metrics on port "
            f"{opts.exporter_port}, read-only host mounts for the vendor tool.", comments),
        "exporter-service.yaml": render(service(opts), "Lists the exporter pods for the ServiceMonitor."),
        "exporter-servicemonitor.yaml": render(
            service_monitor(opts), "Tells the Prometheus Operator to scrape every exporter pod."),
    }
