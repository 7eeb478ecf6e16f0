"""`npudist deploy k8s`: every object validated offline, and wired to what npudist's own parts expect."""

from __future__ import annotations

import re
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from npudist.accelerators import BY_NAME, get
from npudist.dashboards.export import export
from npudist.dashboards.rules import JOB_MATCH, rules_document
from npudist.deploy import PLACEMENTS, K8sOptions
from npudist.deploy.k8s import KUSTOMIZATION, files
from npudist.deploy.options import DeployError
from npudist.launch import parser, plan
from npudist.telemetry.exposition.server import parse_listen
from npudist.telemetry.sources.registry import SOURCES
from tests.conftest import free_ports
from tests.deploy.schemas import pod_templates, validate, validate_core, validate_crd

COMBOS = [(acc, sched) for acc in PLACEMENTS for sched in ("kubeflow", "volcano")]
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SCRAPE_JOB = re.compile(JOB_MATCH.split('"')[1])


def _k8s(**kw) -> K8sOptions:
    """Options as a user with restarts gives them: with the shared run directory they require."""
    kw.setdefault("run_dir_pvc", "npudist-runs")
    return K8sOptions(**kw)


def _objects(opts: K8sOptions) -> dict[str, dict]:
    return {rel: yaml.load(text, Loader=LOADER) for rel, text in files(opts).items()}


def _kind(objs: dict[str, dict], kind: str) -> dict:
    (obj,) = [o for o in objs.values() if o["kind"] == kind]
    return obj


@pytest.mark.parametrize(("accelerator", "scheduler"), COMBOS)
def test_every_object_validates_and_the_kustomization_lists_them(accelerator, scheduler):
    objs = _objects(_k8s(accelerator=accelerator, scheduler=scheduler, nodes=3))
    kustomization = objs.pop(KUSTOMIZATION)
    assert kustomization["resources"] == list(objs)
    for rel, obj in objs.items():
        try:
            validate(obj)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as exc:
            pytest.fail(f"{rel}: {exc.message} at {list(exc.absolute_path)}")
    kinds = sorted(o["kind"] for o in objs.values())
    job_kind = {"kubeflow": "PyTorchJob", "volcano": "Job"}[scheduler]
    assert kinds == sorted(["Namespace", "DaemonSet", "Service", "ServiceMonitor", "PrometheusRule", "PodMonitor",
                            "NetworkPolicy", job_kind, *["ConfigMap"] * 5])


def test_the_validators_reject_a_misspelt_field():
    objs = _objects(_k8s(accelerator="npu"))
    ds = _kind(objs, "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core(ds)
    pm = _kind(objs, "PodMonitor")
    pm["spec"]["podMetricsEndpoints"][0]["prot"] = pm["spec"]["podMetricsEndpoints"][0].pop("port")
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(pm)
    job = _kind(objs, "PyTorchJob")
    pod_templates(job)[0]["spec"]["containers"][0]["argz"] = ["x"]
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(job)
    rule = _kind(objs, "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["recrd"] = "x"
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(rule)


@pytest.mark.subprocess
def test_prometheusrule_holds_the_exported_rules_and_passes_promtool(tmp_path):
    rule = _kind(_objects(_k8s()), "PrometheusRule")
    assert rule["spec"] == rules_document()
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian prometheus) not installed; .ci/run installs it")
    (tmp_path / "groups.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    res = subprocess.run([promtool, "check", "rules", str(tmp_path / "groups.yml")], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_each_dashboard_configmap_holds_exactly_what_dashboards_export_writes(tmp_path):
    exported = {p.name: p.read_bytes() for p in export(tmp_path) if p.parent.name == "grafana"}
    maps = [o for o in _objects(_k8s()).values() if o["kind"] == "ConfigMap"]
    assert len(maps) == len(exported) == 5
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, text),) = cm["data"].items()
        assert text.encode() == exported[key]


@pytest.mark.parametrize("accelerator", list(PLACEMENTS))
def test_exporter_listens_on_all_interfaces_with_read_only_mounts_and_a_liveness_probe(accelerator):
    opts = _k8s(accelerator=accelerator, exporter_port=9411)
    objs = _objects(opts)
    pod = _kind(objs, "DaemonSet")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = c["args"]
    assert c["command"] == ["npudist", "exporter"]
    assert parse_listen(args[args.index("--listen") + 1]) == ("0.0.0.0", 9411)
    source = args[args.index("--source") + 1]
    assert source == BY_NAME[accelerator].telemetry_source and source in SOURCES
    assert c["ports"] == [{"name": "metrics", "containerPort": 9411, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    host_paths = {v["name"] for v in pod["volumes"] if "hostPath" in v}
    assert {m["name"] for m in c["volumeMounts"] if m.get("readOnly")} >= host_paths
    assert pod["nodeSelector"] == PLACEMENTS[accelerator].node_selector
    monitor = _kind(objs, "ServiceMonitor")
    service = _kind(objs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert SCRAPE_JOB.fullmatch(service["metadata"]["name"])  # the ServiceMonitor's job label
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_only_the_npu_exporter_is_privileged_and_the_yaml_says_why():
    text = files(_k8s(accelerator="npu"))["exporter-daemonset.yaml"].splitlines()
    at = next(i for i, line in enumerate(text) if line.strip() == "privileged: true")
    assert text[at - 1].strip().startswith("#") and "device cgroup" in " ".join(text[at - 4:at])
    assert "huawei.com/Ascend910" in "\n".join(text)
    for acc in ("cuda", "cpu"):
        pod = _kind(_objects(_k8s(accelerator=acc)), "DaemonSet")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        sc = pod["containers"][0]["securityContext"]
        assert "privileged" not in sc and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize(("accelerator", "scheduler"), [("npu", "kubeflow"), ("cuda", "volcano"), ("cpu", "volcano")])
def test_job_runs_npudist_launch_over_c10d_on_the_master_with_every_rank_scraped(accelerator, scheduler):
    base = free_ports(4, "0.0.0.0")
    opts = _k8s(accelerator=accelerator, scheduler=scheduler, nodes=3, nproc_per_node=4, metrics_port=base,
                      shm_size="2Gi", script=("train.py", "--steps", "5"))
    objs = _objects(opts)
    job = _kind(objs, {"kubeflow": "PyTorchJob", "volcano": "Job"}[scheduler])
    master_host = {"kubeflow": "npudist-train-master-0", "volcano": "npudist-train-master-0.npudist-train"}[scheduler]
    templates = pod_templates(job)
    assert len(templates) == 2
    replicas = ([r["replicas"] for r in job["spec"]["pytorchReplicaSpecs"].values()] if scheduler == "kubeflow"
                else [t["replicas"] for t in job["spec"]["tasks"]])
    assert replicas == [1, 2]
    monitor = _kind(objs, "PodMonitor")
    for template, is_host in zip(templates, ("true", "false"), strict=True):
        (c,) = template["spec"]["containers"]
        assert c["command"] == ["npudist", "launch"]
        ns = parser().parse_args(c["args"])
        assert (ns.nnodes, ns.nproc_per_node, ns.rdzv_backend) == ("3", "4", "c10d")
        assert ns.rdzv_endpoint == f"{master_host}:29400" and ns.rdzv_conf == f"is_host={is_host}"
        assert (ns.training_script, ns.training_script_args) == ("train.py", ["--steps", "5"])
        # npudist launch itself accepts these arguments and asks the ranks to serve on every interface.
        env = {e["name"]: e.get("value") for e in c["env"]}
        launch = plan(c["args"], get("cpu"), {k: v for k, v in env.items() if v})
        assert launch.env_updates["NPUDIST_METRICS_PORT"] == str(base)
        assert parse_listen(f"{env['NPUDIST_METRICS_HOST']}:{base}")[0] == "0.0.0.0"
        assert c["env"][1]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        resource = PLACEMENTS[accelerator].resource
        assert c["resources"]["limits"] == ({resource: "4"} if resource else {})
        shm = next(v for v in template["spec"]["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        rank_ports = {p["name"]: p["containerPort"] for p in c["ports"] if p["name"].startswith("metrics")}
        assert sorted(rank_ports.values()) == [base + i for i in range(4)]
        assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == list(rank_ports)
        labels = template["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert SCRAPE_JOB.fullmatch(labels[monitor["spec"]["jobLabel"]])


def test_a_one_node_job_has_only_the_master():
    job = _kind(_objects(_k8s(nodes=1)), "PyTorchJob")
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    vc = _kind(_objects(_k8s(nodes=1, scheduler="volcano")), "Job")
    assert [t["name"] for t in vc["spec"]["tasks"]] == ["master"] and vc["spec"]["minAvailable"] == 1


@pytest.mark.subprocess
def test_kustomize_builds_the_folder(tmp_path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (optional: validation above does not need it)")
    from npudist.deploy import write_files

    generated = files(_k8s(monitor_labels=("release=kps",)))
    write_files(tmp_path, generated)
    res = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stderr
    built = list(yaml.safe_load_all(res.stdout))
    assert len(built) == len(generated) - 1
    monitors = [o for o in built if o["kind"] in ("ServiceMonitor", "PodMonitor", "PrometheusRule")]
    assert len(monitors) == 3 and all(o["metadata"]["labels"]["release"] == "kps" for o in monitors)


@pytest.mark.parametrize(("accelerator", "scheduler"), COMBOS)
def test_training_pods_run_restricted_with_no_token_unless_asked(accelerator, scheduler):
    """The 'restricted' Pod Security Standard's container rules (no escalation, all capabilities dropped,
    RuntimeDefault seccomp) and no service-account token: training calls no Kubernetes API."""
    kind = {"kubeflow": "PyTorchJob", "volcano": "Job"}[scheduler]
    for opts, token, caps in [
        (_k8s(accelerator=accelerator, scheduler=scheduler, nodes=2), False, None),
        (_k8s(accelerator=accelerator, scheduler=scheduler, nodes=2, service_account_token=True,
                    add_capabilities=("IPC_LOCK",)), True, ["IPC_LOCK"]),
    ]:
        job = _kind(_objects(opts), kind)
        validate(job)
        for template in pod_templates(job):
            spec = template["spec"]
            assert spec["automountServiceAccountToken"] is token
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            (c,) = spec["containers"]
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert c["securityContext"]["capabilities"].get("add") == caps


@pytest.mark.parametrize("cap", ["CAP_IPC_LOCK", "ipc_lock", "IPC LOCK", ""])
def test_a_capability_is_a_plain_upper_case_name(cap):
    with pytest.raises(DeployError, match="--add-capability"):
        _k8s(add_capabilities=(cap,))


def test_the_rendezvous_store_is_job_private():
    """Third audit: whoever reaches the rendezvous port can abort every rank through the control counter, so
    the job's pods take connections from each other only (any port) and from anyone on the metrics ports."""
    opts = _k8s(nodes=2)
    objs = _objects(opts)
    policy = objs["job-networkpolicy.yaml"]
    job_obj = next(o for o in objs.values() if o["kind"] in ("PyTorchJob", "Job"))
    pod_labels = next(iter(job_obj["spec"]["pytorchReplicaSpecs"].values()))["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items() and policy["spec"]["policyTypes"] == ["Ingress"]
    peers, metrics = policy["spec"]["ingress"]
    assert peers == {"from": [{"podSelector": {"matchLabels": selector}}]} and "ports" not in peers
    assert "from" not in metrics
    assert sorted(p["port"] for p in metrics["ports"]) == [opts.metrics_port + i for i in range(opts.nproc)]
    assert opts.rdzv_port not in {p["port"] for p in metrics["ports"]}
