"""`npudist doctor --master-addr`: route, interface, MTU and the rendezvous port, against an injected host."""

import pytest

from npudist.doctor.host import Host
from npudist.doctor.multinode import route_to_master
from npudist.runtime.network import Interface, NetworkError


def _results(env, iface=None, connect_error=None, route_error=None):
    def route(addr):
        if route_error:
            raise NetworkError(route_error)
        return iface or Interface("eth1", "10.213.0.2", 1500)

    def connect(addr, port, timeout):
        if connect_error:
            raise connect_error

    return {r.name: r for r in route_to_master(Host(env=env, route=route, connect=connect))}


def test_route_interface_and_a_listening_port_pass():
    got = _results({"MASTER_ADDR": "10.213.0.1", "MASTER_PORT": "29500"})
    assert got["route-to-master"].status == "ok"
    assert got["route-to-master"].finding == "10.213.0.1 is reached through eth1 (10.213.0.2, MTU 1500)"
    assert got["rendezvous-port"].status == "ok" and "mtu" not in got


@pytest.mark.parametrize(("error", "status", "says"), [
    (ConnectionRefusedError(), "warn", "nothing listens there yet"),
    (TimeoutError(), "fail", "did not answer in 3 s"),
    (OSError(113, "No route to host"), "fail", "unreachable: [Errno 113] No route to host"),
])
def test_the_rendezvous_port_tells_not_yet_listening_from_dropped(error, status, says):
    got = _results({"MASTER_ADDR": "10.213.0.1"}, connect_error=error)["rendezvous-port"]
    assert got.status == status and says in got.finding and "10.213.0.1:29500" in got.finding


def test_an_interface_variable_that_disagrees_with_the_route_and_a_small_mtu_are_warned():
    got = _results({"MASTER_ADDR": "10.213.0.1", "GLOO_SOCKET_IFNAME": "docker0"},
                   iface=Interface("eth1", "10.213.0.2", 1400))
    wrong = got["interface-variables"]
    assert wrong.status == "warn" and "GLOO_SOCKET_IFNAME=docker0" in wrong.finding
    assert got["mtu"].status == "warn" and "MTU 1400" in got["mtu"].finding


def test_no_route_fails_and_no_master_skips():
    got = _results({"MASTER_ADDR": "nohost"}, route_error="nohost does not resolve")
    assert got["route-to-master"].status == "fail"
    assert _results({})["route-to-master"].status == "skip"


@pytest.mark.parametrize(("var", "spec", "routed"), [
    ("NCCL_SOCKET_IFNAME", "^eth1", False),  # '^' excludes the route's interface (a substring test said ok)
    ("NCCL_SOCKET_IFNAME", "^=eth1,ib0", False),
    ("HCCL_SOCKET_IFNAME", "^eth", False),
    ("NCCL_SOCKET_IFNAME", "=eth", False),  # '=' asks for the exact name
    ("GLOO_SOCKET_IFNAME", "eth", False),  # gloo takes exact names only
    ("HCCL_IF_IP", "10.213.0.29", False),
    ("NCCL_SOCKET_IFNAME", "eth", True),  # a prefix
    ("NCCL_SOCKET_IFNAME", "^=eth0", True),  # excludes eth0 only
    ("HCCL_SOCKET_IFNAME", "=ib0, eth1", True),
    ("GLOO_SOCKET_IFNAME", "ib0,eth1", True),
    ("HCCL_IF_IP", "10.213.0.2", True),
])
def test_interface_variables_are_read_as_the_backends_read_them(var, spec, routed):
    got = _results({"MASTER_ADDR": "10.213.0.1", var: spec})
    assert ("interface-variables" not in got) == routed, got.get("interface-variables")
    if not routed:
        assert f"{var}={spec}" in got["interface-variables"].finding
