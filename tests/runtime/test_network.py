"""Choosing the interface that routes to the master, from `ip` output recorded on real hosts."""

import pytest

from npudist.runtime import network
from npudist.runtime.env import launcher_env
from npudist.runtime.network import Interface, NetworkError, Route

# Recorded with iproute2 6.1 (Debian 12): a worker node of a two-node cluster in namespaces (npudist.testing.
# cluster), the master node asking for its own address, and a host with a gateway.
WORKER_ROUTE = "10.213.0.1 dev eth0 src 10.213.0.2 uid 0 \\    cache \n"
MASTER_ROUTE = "local 10.213.0.1 dev lo src 10.213.0.1 uid 0 \\    cache <local> \n"
GATEWAY_ROUTE = "8.8.8.8 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0 \\    cache \n"
LOOPBACK_ROUTE = "local 127.0.0.1 dev lo src 127.0.0.1 uid 0 \\    cache <local> \n"
MASTER_ADDRS = (
    "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
    "1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever\n"
    "2: eth0    inet 10.213.0.1/24 scope global eth0\\       valid_lft forever preferred_lft forever\n"
    "2: eth0    inet6 fe80::fca5:edff:fe90:cda8/64 scope link tentative \\       valid_lft forever\n"
)
# An Atlas-style host: management NIC first, the training network on a VLAN of a bond (`ip -o addr` names it
# bond0.100@bond0 only in `ip link`; `ip addr` prints the bare name).
MULTI_NIC_ADDRS = (
    "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n"
    "2: enp125s0f0    inet 172.16.0.5/16 brd 172.16.255.255 scope global enp125s0f0\\       valid_lft forever\n"
    "7: bond0.100    inet 192.168.1.101/24 brd 192.168.1.255 scope global bond0.100\\       valid_lft forever\n"
)


def test_a_worker_uses_the_interface_and_source_the_kernel_routes_through():
    route = network.parse_route_get(WORKER_ROUTE)
    assert route == Route("10.213.0.1", "eth0", "10.213.0.2", local=False)
    assert network.interface_for(route, {}) == Interface("eth0", "10.213.0.2")
    assert network.parse_route_get(GATEWAY_ROUTE).device == "eth0"


def test_the_master_node_advertises_the_interface_that_owns_its_address_not_lo():
    route = network.parse_route_get(MASTER_ROUTE)
    assert route.local and route.device == "lo"
    assert network.interface_for(route, network.parse_addresses(MASTER_ADDRS)) == Interface("eth0", "10.213.0.1")


def test_a_training_nic_beside_a_management_nic_is_found_by_its_address():
    addrs = network.parse_addresses(MULTI_NIC_ADDRS)
    assert addrs["bond0.100"] == ["192.168.1.101"]
    route = network.parse_route_get("local 192.168.1.101 dev lo table local src 192.168.1.101 uid 0 \\ cache <local>")
    assert network.interface_for(route, addrs) == Interface("bond0.100", "192.168.1.101")


def test_a_loopback_master_stays_on_lo():
    iface = network.interface_for(network.parse_route_get(LOOPBACK_ROUTE), network.parse_addresses(MASTER_ADDRS))
    assert iface.name == "lo" and network.is_loopback(iface.address)


def test_garbage_route_output_is_an_error_naming_it():
    with pytest.raises(NetworkError, match="no route in `ip route get` output: 'RTNETLINK answers"):
        network.parse_route_get("RTNETLINK answers: Network is unreachable")


def test_every_backend_variable_is_set_unless_the_user_set_it():
    iface = Interface("bond0.100", "192.168.1.101")
    assert network.socket_env(iface, {}) == {
        "GLOO_SOCKET_IFNAME": "bond0.100", "NCCL_SOCKET_IFNAME": "=bond0.100",
        "HCCL_SOCKET_IFNAME": "bond0.100", "HCCL_IF_IP": "192.168.1.101"}
    assert "HCCL_IF_IP" not in network.socket_env(iface, {"HCCL_IF_IP": "10.0.0.9"})


def test_route_to_reads_the_kernel_through_ip():
    calls = []

    def fake_ip(args):
        calls.append(args)
        return WORKER_ROUTE if args[1] == "route" else ""

    assert network.route_to("10.213.0.1", ip=fake_ip).name == "eth0"
    assert calls[0] == ["-o", "route", "get", "10.213.0.1"]


@pytest.mark.parametrize(("addr", "loop"), [("127.0.0.1", True), ("127.0.1.1", True), ("::1", True),
                                             ("10.213.0.1", False), ("node0", False)])
def test_is_loopback(addr, loop):
    assert network.is_loopback(addr) is loop


# --- init(): the loopback refusal and the "connection refused" explanation ------------------------------------

def _info(rank=2, world=4, local=2):
    from npudist.runtime.env import RankInfo

    return RankInfo(rank=rank, world_size=world, local_rank=rank % local, local_world_size=local,
                    node_rank=rank // local, source="torchrun")


def test_a_multi_node_rank_that_would_advertise_loopback_is_refused_naming_the_fix(monkeypatch):
    from npudist import lifecycle

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(network, "gloo_address", lambda env: ("127.0.1.1", "hostname node1 resolves to it"))
    monkeypatch.setattr(network, "route_to", lambda host: Interface("eth0", "10.213.0.2"))
    with pytest.raises(lifecycle.DistInitError) as err:
        lifecycle._check_advertised(_info(), launcher_env({"MASTER_ADDR": "10.213.0.1"}), "gloo")
    text = str(err.value)
    for part in ("rank 2 of 4 (node 1) would advertise 127.0.1.1", "hostname node1 resolves to it",
                 "eth0 (10.213.0.2)", "export GLOO_SOCKET_IFNAME=eth0"):
        assert part in text


@pytest.mark.parametrize(("master", "advertised", "local", "refused"), [
    ("10.213.0.1", "10.213.0.2", 2, False),   # the right interface
    ("127.0.0.1", "127.0.0.1", 2, False),     # every node on this host: loopback is shared
    ("10.213.0.1", "127.0.0.1", 4, False),    # a single node: nobody else needs the address
])
def test_the_refusal_leaves_working_layouts_alone(monkeypatch, master, advertised, local, refused):
    from npudist import lifecycle

    monkeypatch.setattr(network, "gloo_address", lambda env: (advertised, "test"))
    lifecycle._check_advertised(_info(world=4, local=local), launcher_env({"MASTER_ADDR": master}), "gloo")


def test_connection_refused_from_a_loopback_peer_is_called_a_wrong_interface_not_a_dead_rank():
    from npudist import lifecycle

    gloo = "Connection refused, remote=[127.0.0.1]:31617"  # what gloo says (the reproduction)
    text = str(lifecycle._refused(gloo, _info(rank=0), "10.213.0.1:29500"))
    assert "advertised 127.0.0.1:31617, a loopback address" in text and "wrong-interface" in text
    assert "died" not in text and "GLOO_SOCKET_IFNAME" in text
    dead = str(lifecycle._refused("Connection refused, remote=[10.213.0.2]:40211", _info(rank=0),
                                  "10.213.0.1:29500"))
    assert "at 10.213.0.2:40211" in dead and "died or was restarted" in dead and "loopback" not in dead
