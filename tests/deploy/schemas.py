"""Offline validators: Kubernetes core kinds with kubernetes-validate, CRD kinds with the CRDs' own schemas.

CRD schemas (tests/schemas/crds/, provenance in tests/fakes/README.md) leave unknown fields to the API
server, which prunes them, or rejects them under kubectl's default strict field validation. To catch a
misspelt field here too, every object schema that lists its properties is closed (additionalProperties:
false) unless it says x-kubernetes-preserve-unknown-fields.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import jsonschema
import kubernetes_validate

from tests.conftest import REPO

KUBERNETES_VERSION = "1.30.0"
"""The Kubernetes release the core kinds are checked against (schemas shipped in kubernetes-validate)."""
CRDS = REPO / "tests" / "schemas" / "crds"
CRD_FILES = {
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_podmonitors.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.json",
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.json",
    ("batch.volcano.sh/v1alpha1", "Job"): "batch.volcano.sh_jobs.json",
}


def _closed(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _closed(v) for k, v in node.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_closed(v) for v in node]
    return node


@cache
def crd_validator(api_version: str, kind: str) -> jsonschema.Draft4Validator:
    doc = json.loads((CRDS / CRD_FILES[(api_version, kind)]).read_text())
    assert f"{doc['group']}/{doc['version']}" == api_version and doc["kind"] == kind
    return jsonschema.Draft4Validator(_closed(doc["openAPIV3Schema"]))


def validate_core(obj: dict[str, Any]) -> None:
    """Raises kubernetes_validate.ValidationError (strict: unknown fields are errors)."""
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def validate_crd(obj: dict[str, Any]) -> None:
    """The CRD's schema, the object's metadata as ObjectMeta, and every embedded pod template as a core
    PodTemplateSpec (the CRDs embed it, but the API server checks pods only when it creates them)."""
    crd_validator(obj["apiVersion"], obj["kind"]).validate(obj)
    validate_core({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]})
    for template in pod_templates(obj):
        validate_core({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template})


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    if obj["kind"] == "PyTorchJob":
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    return [t["template"] for t in spec.get("tasks", [])]


def validate(obj: dict[str, Any]) -> None:
    if (obj["apiVersion"], obj["kind"]) in CRD_FILES:
        validate_crd(obj)
    else:
        validate_core(obj)
