"""A cluster on one machine: N nodes as network namespaces on a bridge, each with its own hostname.

Every node is an ``ip netns`` namespace with one veth interface (``eth0``, an address on a private /24)
whose other end sits on a bridge in the root namespace; processes started on a node also get their own
UTS namespace (``unshare --uts``) so their hostname is the node's (``hostnames`` may give several nodes one
name, as boards flashed from one image have; ``own_pids`` gives each node its own pid namespace and /proc, as
containers have: a pid then means nothing on another node). All nodes see the same filesystem, as
nodes see a shared NFS directory. Faults act where they act on a real cluster: a killed node loses every
process, a partitioned node's cable is pulled (the bridge port goes down), a slow link is shaped with
``tc tbf`` on both directions, a stopped rank gets SIGSTOP. Needs root and iproute2; ``unavailable()``
says why not. ``close()`` removes every interface, namespace and process it made, in that order of need:
processes first (they hold the namespaces), then namespaces (their veth ends go with them), then the bridge.

A run that was killed never reaches ``close()``, and its bridge would keep its /24: a next cluster on the
same subnet would send part of its traffic there. So every bridge carries its owner's pid and start time
in its alias, each new cluster first removes what owners that are gone left (``sweep``), and a cluster
takes a /24 that no interface or route of this host uses (``free_subnet``) unless told one.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

TIMEOUT_S = 10.0
SUBNETS = "10.213.0.0/16"
"""Where clusters take their /24 from."""
_OWNER = re.compile(r"^npudist-cluster owner=(\d+) start=(\d+)$")
_ROUTE_TYPES = frozenset({"unicast", "local", "broadcast", "multicast", "anycast", "blackhole", "unreachable",
                          "prohibit", "throw", "nat"})
"""`ip route` route types that come before the destination."""
_BRIDGE = re.compile(r"^npdbr([0-9a-f]{4})$")
_NETNS = re.compile(r"^npd([0-9a-f]{4})-n\d+$")
# The hostname is set inside the new UTS namespace, then the command replaces the shell; the script is
# fixed text and every value reaches it as a positional argument, never as shell source.
_SET_HOSTNAME = 'hostname "$1" && shift && exec "$@"'
_OWN_PIDS = MappingProxyType({False: (), True: ("--pid", "--fork", "--mount-proc")})
"""unshare's options for a node with its own pid namespace: the launcher is its pid 1, /proc shows the node's."""


class ClusterUnavailable(RuntimeError):
    """Namespaces cannot be made here; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if check and done.returncode != 0:
        raise ClusterUnavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why a cluster cannot be built here, or None when it can (root, iproute2, unshare, netns support)."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth, bridge)"
    for tool in ("ip", "unshare", "tc", "hostname"):
        if shutil.which(tool) is None:
            return f"needs {tool} (iproute2 / util-linux)"
    probe = f"npdprobe{secrets.token_hex(3)}"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"cannot make a network namespace: {done.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Node:
    index: int
    hostname: str
    netns: str
    address: str
    port: str
    """The bridge port (veth end in the root namespace) that is this node's cable."""
    procs: list[subprocess.Popen] = field(default_factory=list)


class Cluster:
    """``with Cluster(2) as c: c.spawn(c.nodes[0], argv)``; nothing of it outlives the ``with``."""

    def __init__(self, nodes: int, *, subnet: str | None = None, run_dir: str | os.PathLike | None = None,
                 mtu: int = 1500, hostnames: Sequence[str] | None = None, own_pids: bool = False) -> None:
        """``subnet``: the first three octets of the /24 to use ("10.213.7"); None: a free one, taken on entry.
        ``hostnames``: one per node (default node0, node1...); ``own_pids``: each node's processes in their own
        pid namespace with their own /proc."""
        if not 1 <= nodes <= 200:
            raise ValueError(f"nodes={nodes}: give 1 to 200")
        if hostnames is not None and len(hostnames) != nodes:
            raise ValueError(f"hostnames={list(hostnames)}: give one per node ({nodes})")
        self.own_pids = own_pids
        self.tag = secrets.token_hex(2)
        self.bridge = f"npdbr{self.tag}"
        self.subnet = subnet
        self.run_dir = Path(run_dir) if run_dir else None
        self.mtu = mtu
        names = list(hostnames) if hostnames is not None else [f"node{i}" for i in range(nodes)]
        self.nodes = [Node(i, names[i], f"npd{self.tag}-n{i}", "", f"npd{self.tag}p{i}") for i in range(nodes)]
        self._address(subnet or "0.0.0")
        self._made: list[tuple[str, str]] = []

    def _address(self, subnet: str) -> None:
        self.gateway = f"{subnet}.254"
        for n in self.nodes:
            n.address = f"{subnet}.{n.index + 1}"

    def __enter__(self) -> Cluster:
        reason = unavailable()
        if reason:
            raise ClusterUnavailable(reason)
        sweep()
        if self.subnet is None:
            self.subnet = free_subnet()
        else:
            taken = _subnet_user(self.subnet)
            if taken:
                raise ClusterUnavailable(f"subnet {self.subnet}.0/24 is in use here ({taken}); give another or "
                                         "leave subnet unset to take a free one")
        self._address(self.subnet)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        me = os.getpid()
        _ip("link", "set", self.bridge, "alias", f"npudist-cluster owner={me} start={_start_time(me)}")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for n in self.nodes:
            _ip("netns", "add", n.netns)
            self._made.append(("netns", n.netns))
            _ip("link", "add", n.port, "mtu", str(self.mtu), "type", "veth", "peer", "name", "eth0",
                "netns", n.netns)
            self._made.append(("link", n.port))
            _ip("link", "set", n.port, "master", self.bridge, "up")
            for args in (("addr", "add", f"{n.address}/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                         ("link", "set", "lo", "up")):
                _ip("-n", n.netns, *args)

    def spawn(self, node: Node, argv: Sequence[str], env: Mapping[str, str] | None = None,
              log: str | os.PathLike | None = None) -> subprocess.Popen:
        """Start ``argv`` on ``node`` (its network, its hostname), in its own process group."""
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 (closed with the process)
        try:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", node.netns, "unshare", "--uts", *_OWN_PIDS[self.own_pids], "--", "sh", "-c",
                 _SET_HOSTNAME, "sh", node.hostname, *argv],
                env=dict(os.environ if env is None else env), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        finally:
            if log:
                out.close()
        node.procs.append(proc)
        return proc

    def launch(self, node: Node, script_argv: Sequence[str], *, nproc: int = 2, port: int = 29511,
               elastic: bool = False, launch_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
               log: str | os.PathLike | None = None) -> subprocess.Popen:
        """``npudist launch`` on ``node`` as each node's operator would type it: static rendezvous at node 0
        (``--nnodes N --node-rank i --master-addr``), or with ``elastic`` c10d rendezvous at node 0 with
        ``--nnodes 1:N`` and 3 restarts, so the job may go on with the nodes that are left."""
        if elastic:
            where = ["--nnodes", f"1:{len(self.nodes)}", "--rdzv-backend", "c10d", "--rdzv-id", f"npd{self.tag}",
                     "--rdzv-endpoint", f"{self.nodes[0].address}:{port}", "--max-restarts", "3",
                     "--rdzv-conf", "last_call_timeout=2"]
        else:
            where = ["--nnodes", str(len(self.nodes)), "--node-rank", str(node.index), "--master-addr",
                     self.nodes[0].address, "--master-port", str(port)]
        argv = [sys.executable, "-m", "npudist", "launch", *where, "--nproc-per-node", str(nproc), *launch_args,
                *script_argv]
        return self.spawn(node, argv, env=env, log=log)

    def node_of(self, rank: int, nproc: int) -> Node:
        return self.nodes[rank // nproc]

    def describe(self, ranks: Sequence[int], nproc: int) -> str:
        """``node1 (10.213.0.2, ranks 2-3)`` for ranks that make up whole nodes, else the ranks with their nodes."""
        parts = []
        for node in self.nodes:
            mine = sorted(r for r in ranks if r // nproc == node.index)
            if not mine:
                continue
            whole = mine == list(range(node.index * nproc, (node.index + 1) * nproc))
            span = f"ranks {mine[0]}-{mine[-1]}" if whole and len(mine) > 1 else f"rank(s) {', '.join(map(str, mine))}"
            parts.append(f"{node.hostname} ({node.address}, {span})")
        return "; ".join(parts)

    def run(self, node: Node, argv: Sequence[str], timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """Run a short command on ``node`` and return its output."""
        return subprocess.run(["ip", "netns", "exec", node.netns, *argv], capture_output=True, text=True,
                              timeout=timeout, check=False)

    # Faults -------------------------------------------------------------------------------------------
    def pids(self, node: Node) -> list[int]:
        """Every process in the node's network namespace, whatever session or group it moved to (torchrun's
        workers start their own)."""
        return [int(p) for p in _ip("netns", "pids", node.netns, check=False).stdout.split()]

    def kill_node(self, node: Node) -> None:
        """Every process of the node dies at once (power loss, kernel panic): all are frozen first, so none
        sees another die and writes a last word a dead host could not."""
        pids = [p.pid for p in node.procs] + self.pids(node)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def partition(self, node: Node) -> None:
        """Pull the node's cable: its bridge port goes down, its processes keep running."""
        _ip("link", "set", node.port, "down")

    def slow(self, node: Node, rate: str = "10mbit") -> None:
        """Shape the node's link both ways to ``rate`` (tc tbf; netem is not needed)."""
        for prefix, dev in (((), node.port), (("-n", node.netns), "eth0")):
            done = subprocess.run(["tc", *prefix, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                                   "burst", "32kbit", "latency", "400ms"], capture_output=True, text=True,
                                  timeout=TIMEOUT_S, check=False)
            if done.returncode != 0:
                raise ClusterUnavailable(f"tc tbf on {dev}: {done.stderr.strip()}")

    @staticmethod
    def stop(pid: int) -> None:
        """Freeze one process (a rank stuck in the kernel or a debugger)."""
        os.kill(pid, signal.SIGSTOP)

    def heal(self, node: Node) -> None:
        """Undo partition and slow on ``node``."""
        _ip("link", "set", node.port, "up")
        for prefix, dev in (((), node.port), (("-n", node.netns), "eth0")):
            subprocess.run(["tc", *prefix, "qdisc", "del", "dev", dev, "root"], capture_output=True,
                           timeout=TIMEOUT_S, check=False)

    # Teardown -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process started on a node, then remove namespaces and links; safe to call twice."""
        for n in self.nodes:
            self.kill_node(n)
            for proc in n.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=TIMEOUT_S)
            n.procs.clear()
        for kind, name in reversed(self._made):
            if kind == "netns":
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)
        self._made.clear()

    def leftovers(self) -> list[str]:
        """Interfaces and namespaces of this cluster still present (empty after close())."""
        links = _ip("-o", "link", check=False).stdout
        spaces = _ip("netns", "list", check=False).stdout
        return [name for name in [self.bridge, *(n.port for n in self.nodes)] if f" {name}:" in links
                or f" {name}@" in links] + [n.netns for n in self.nodes if n.netns in spaces]


def _start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): a pid that was reused
    by another process has another start time. 0 when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[19])


def _owner_alive(alias: str) -> bool:
    m = _OWNER.match(alias.strip())
    return bool(m) and _start_time(int(m[1])) == int(m[2]) != 0


def sweep() -> list[str]:
    """Remove what clusters whose owner process is gone left behind (a run killed before ``close()``): their
    nodes' processes, namespaces, veth ends and bridge. Returns what was removed. A cluster whose owner
    still runs, and any interface that is not a cluster's, are left alone."""
    links = _ip("-o", "link", "show", check=False).stdout.splitlines()
    bridges: dict[str, str] = {}
    for line in links:
        m = re.match(r"^\d+:\s+(npdbr[0-9a-f]{4})[:@]", line)
        if m:
            alias = re.search(r"\balias (.*)$", line)
            bridges[_BRIDGE.match(m[1])[1]] = alias[1] if alias else ""
    spaces = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    stale = {tag for tag, alias in bridges.items() if not _owner_alive(alias)}
    # A namespace without its bridge: its owner died while closing (namespaces go first), or before it set up.
    stale |= {m[1] for m in map(_NETNS.match, spaces) if m and m[1] not in bridges}
    removed: list[str] = []
    for tag in sorted(stale):
        for name in [s for s in spaces if s.startswith(f"npd{tag}-n")]:
            for pid in _ip("netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", name, check=False)
            removed.append(name)
        for line in links:
            m = re.match(rf"^\d+:\s+(npd{tag}p\d+|npdbr{tag})[:@]", line)
            if m and _ip("link", "del", m[1], check=False).returncode == 0:
                removed.append(m[1])
    return removed


def _subnet_user(subnet: str) -> str | None:
    """What on this host already uses ``subnet``.0/24 (an address or a route), or None."""
    net = ipaddress.ip_network(f"{subnet}.0/24")
    for line in _ip("-o", "-4", "addr", "show", check=False).stdout.splitlines():
        m = re.search(r"^\d+:\s+(\S+)\s+inet\s+(\S+)", line)
        if m and ipaddress.ip_interface(m[2]).network.overlaps(net):
            return f"{m[1]} has {m[2]}"
    for line in _ip("-o", "-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        words = line.split()
        if words and words[0] in _ROUTE_TYPES:
            words = words[1:]
        with contextlib.suppress(ValueError, IndexError):
            dest = ipaddress.ip_network(words[0], strict=False)  # "default" is a ValueError: skipped
            if dest.prefixlen > 0 and dest.overlaps(net):
                return f"route {line.strip()[:80]}"
    return None


def free_subnet(pool: str = SUBNETS) -> str:
    """A /24 of ``pool`` that no address or route of this host touches, in random order, so that two runs
    starting together rarely try the same one ("10.213.57")."""
    nets = list(ipaddress.ip_network(pool).subnets(new_prefix=24))
    random.shuffle(nets)
    for net in nets:
        subnet = str(net.network_address).rsplit(".", 1)[0]
        if _subnet_user(subnet) is None:
            return subnet
    raise ClusterUnavailable(f"every /24 of {pool} is in use on this host")
