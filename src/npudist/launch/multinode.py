"""What `npudist launch` adds for a job on several nodes: the interface that routes to the master.

The ranks and torchrun's agent each name an address to their peers; left to themselves they take the
host name's, which is loopback or the wrong NIC on many hosts. The route to the master decides instead
(npudist.runtime.network reads it from the kernel).
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Callable, Mapping, Sequence

from npudist.runtime import network
from npudist.runtime.network import Interface


def master_host(ns: argparse.Namespace, static: bool) -> str:
    if static or not ns.rdzv_endpoint:
        return str(ns.master_addr)
    host = str(ns.rdzv_endpoint).strip()
    if host.startswith("["):  # [v6]:port
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _hostname_resolves() -> bool:
    try:
        socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        return False
    return True


def _drop_option(argv: list[str], names: Sequence[str], keep_first: bool) -> None:
    """Remove later occurrences of an option (and its value) from ``argv``, keeping the first."""
    seen, i = False, 0
    while i < len(argv):
        tok = argv[i]
        if tok in names or any(tok.startswith(n + "=") for n in names):
            if keep_first and not seen:
                seen, i = True, i + (1 if "=" in tok else 2)
                continue
            del argv[i: i + (1 if "=" in tok else 2)]
            continue
        i += 1


def with_interface(torchrun_argv: list[str], master: str, env: Mapping[str, str],
                    route: Callable[[str], Interface], is_c10d: bool = False, rdzv_conf: str | None = None,
                    local_addr_given: bool = False) -> tuple[dict[str, str], list[str]]:
    """Point every backend at the interface that routes to the master, unless the user chose one: what gloo
    picks by itself (the hostname's address) is loopback on many hosts, and peers on other nodes cannot
    reach it. torchrun's own choices of address (--local-addr, c10d's store host) follow the same route:
    options for it are put in front of ``torchrun_argv``. Returns the ranks' variables and the notes."""
    notes: list[str] = []
    try:
        iface = route(master)
        master_address = network.resolve(master)
    except network.NetworkError as exc:
        notes.append(f"multi-node: no interface chosen ({exc}); set GLOO_SOCKET_IFNAME (and NCCL_/HCCL_"
                              "SOCKET_IFNAME) to the interface on the master's network")
        return {}, notes
    if iface.name == "lo":  # every node on this host (a test or a tutorial): loopback is right
        return {}, notes
    if is_c10d and not _hostname_resolves() and "is_host" not in (rdzv_conf or ""):
        # torchrun's c10d decides who hosts the store by resolving this host's name
        # (rendezvous/utils.py _matches_machine_hostname), and a name that does not resolve ends the agent
        # with gaierror; the route already says whether the endpoint is this node's own address.
        host = "true" if iface.address == master_address else "false"
        torchrun_argv[:0] = ["--rdzv-conf", ",".join(filter(None, [rdzv_conf, f"is_host={host}"]))]
        if rdzv_conf:
            _drop_option(torchrun_argv, ("--rdzv-conf", "--rdzv_conf"), keep_first=True)
        notes.append(f"multi-node: hostname {socket.gethostname()} does not resolve; told torchrun's "
                              f"c10d rendezvous is_host={host} (this node {'hosts' if host == 'true' else 'joins'}"
                              " the store)")
    if not local_addr_given:
        # The agent that ends up rendezvous rank 0 publishes this address as the workers' MASTER_ADDR
        # (torchrun --local-addr; without it, its FQDN, which may not resolve or may name another NIC).
        torchrun_argv[:0] = ["--local-addr", iface.address]
    chosen = network.socket_env(iface, env)
    kept = [v for v in network.IFNAME_VARS if v not in chosen]
    notes.append(
        f"multi-node: {iface.name} ({iface.address}) routes to the master {master}; the ranks get "
        + " ".join(f"{k}={v}" for k, v in chosen.items())
        + (f" (kept your {', '.join(kept)})" if kept else "") + ("" if local_addr_given else
                                                                 f" and torchrun --local-addr {iface.address}")
        + "; export them to choose another interface")
    return chosen, notes


def peer_holder_bind(given: str | None, master: str, route: Callable[[str], Interface],
                     nnodes: str) -> tuple[str, str | None]:
    """(the address this node's peer snapshot holder binds and advertises, a note or None) for a job over
    ``nnodes`` nodes; ValueError with the fix when the holder could not be reached from another node.

    Each rank sends its copy to the holder of a rank on the next node, at the address that holder
    advertised; loopback there makes every copy fail and a replaced node lose its steps (issue 46). The
    interface that routes to the master is the job's network (on the master's own node, the master
    address itself: network.interface_for), so the holder takes that address unless told another.
    """
    try:
        master_address = network.resolve(master)
    except network.NetworkError as exc:
        master_address, why = "", str(exc)
    if master_address and network.is_loopback(master_address):
        return given or "127.0.0.1", None  # every node on this host (a test, a tutorial): loopback is right
    fix = ("drop --peer-snapshot-bind (launch then binds this node's address on the interface that routes to "
           "the master) or give this node's own address on the job's network")
    if given is not None:
        try:
            address = network.resolve(given)
        except network.NetworkError:
            address = given
        if network.is_loopback(address) or network.is_unspecified(address):
            raise ValueError(f"--peer-snapshot-bind {given} on a job over {nnodes} nodes: the other nodes' ranks "
                             f"send their copies to the address this holder advertises, and {given} names no "
                             f"address they can reach; {fix}")
        return given, None
    try:
        if not master_address:
            raise network.NetworkError(why)
        iface = route(master)
    except network.NetworkError as exc:
        raise ValueError(f"--peer-snapshots on {nnodes} nodes: this node's address on the job's network could not "
                         f"be found ({exc}); give it with --peer-snapshot-bind ADDRESS") from None
    return iface.address, (f"peer snapshot holder binds {iface.address} ({iface.name}, the interface that routes "
                           f"to the master {master}); --peer-snapshot-bind ADDRESS chooses another")
