"""The node label: NPUDIST_NODE_NAME (Kubernetes sets it to spec.nodeName) or the host's name."""

import socket

from npudist.telemetry.exposition.collector_health import CollectorHealth
from npudist.telemetry.exposition.device_metrics import DeviceCollector
from npudist.telemetry.exposition.node_label import node_name
from npudist.telemetry.exposition.rank_exporter import serve_rank_metrics


def test_the_variable_wins_over_the_hostname(monkeypatch):
    assert node_name({}) == socket.gethostname()
    assert node_name({"NPUDIST_NODE_NAME": "  "}) == socket.gethostname()
    assert node_name({"NPUDIST_NODE_NAME": "gpu-node-7"}) == "gpu-node-7"
    monkeypatch.setenv("NPUDIST_NODE_NAME", "npu-node-3")
    assert DeviceCollector([], CollectorHealth()).node == "npu-node-3"


def test_rank_metrics_carry_the_node_name():
    tel = serve_rank_metrics(env={"NPUDIST_NODE_NAME": "npu-node-3"}, device_source=None)
    try:
        steps = [s for m in tel.registry.collect() if m.name == "npudist_steps" for s in m.samples]
        assert steps and all(s.labels["node"] == "npu-node-3" for s in steps)
    finally:
        tel.close()
