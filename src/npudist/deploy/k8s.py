"""`npudist deploy k8s`: every manifest's text by file name, and a kustomization.yaml listing them."""

from __future__ import annotations

from npudist.deploy import k8s_exporter, k8s_job, k8s_monitoring
from npudist.deploy.manifest import render
from npudist.deploy.options import K8sOptions

KUSTOMIZATION = "kustomization.yaml"


def namespace(opts: K8sOptions) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": opts.namespace, "labels": {"app.kubernetes.io/part-of": "npudist"}}}


def files(opts: K8sOptions) -> dict[str, str]:
    """Relative path -> YAML text (pure: nothing written)."""
    out = {"namespace.yaml": render(namespace(opts), "The namespace everything below lives in.")}
    for part in (k8s_exporter, k8s_monitoring, k8s_job):
        out.update(part.files(opts))
    out[KUSTOMIZATION] = render(
        {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": list(out)},
        "Apply everything with `kubectl apply --server-side -k .`; the CRD kinds need the Prometheus Operator "
        "and the job's operator (Kubeflow training operator or Volcano) installed.")
    return out
