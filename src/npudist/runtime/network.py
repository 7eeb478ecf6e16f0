"""Which interface of this host reaches the master, and the variables each backend reads to use it.

A multi-node rank advertises one address to its peers. gloo takes the address its hostname resolves to
unless GLOO_SOCKET_IFNAME names an interface (torch ProcessGroupGloo.createDefaultDevice); where the
hostname resolves to 127.0.x.x (containers, many /etc/hosts files) every peer on another host is told to
connect to itself. The interface the kernel routes to the master address through is the one the ranks
must use, so it is read from the kernel (``ip -o route get``) and handed to every backend's variable.
The parsers are pure; the readers run ``ip`` with a timeout.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

IFNAME_VARS: Mapping[str, str] = MappingProxyType({
    # gloo: comma list of names (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, GLOO_SOCKET_IFNAME).
    "GLOO_SOCKET_IFNAME": "name",
    # NCCL: prefix list, '=' for exact (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
    "NCCL_SOCKET_IFNAME": "=name",
    # HCCL: HCCL_IF_IP wins over HCCL_SOCKET_IFNAME (CANN env var reference, "HCCL_IF_IP").
    "HCCL_SOCKET_IFNAME": "name",
    "HCCL_IF_IP": "address",
})
"""Each backend's interface variable and what it is set to: the name, '=' + name, or the address."""

IFNAME_RULES: Mapping[str, str] = MappingProxyType({
    # Comma list of prefixes; a leading '^' excludes the list, a leading '=' (after any '^') asks for exact
    # names (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html, NCCL_SOCKET_IFNAME).
    "NCCL_SOCKET_IFNAME": "prefixes",
    # The same four forms: eth, ^eth, =eth0, ^=eth0 (CANN env var reference, "HCCL_SOCKET_IFNAME").
    "HCCL_SOCKET_IFNAME": "prefixes",
    # Comma list of exact names, each a device gloo uses (ProcessGroupGloo.cpp, GLOO_SOCKET_IFNAME).
    "GLOO_SOCKET_IFNAME": "names",
    "HCCL_IF_IP": "address",
})
"""How each backend reads its interface variable; ``selects`` applies it."""


def matching(var: str, spec: str, names: list[str]) -> list[str]:
    """The interfaces of ``names`` that ``var=spec`` selects, read as that backend reads it (IFNAME_RULES);
    for HCCL_IF_IP, the names are addresses."""
    rule = IFNAME_RULES.get(var, "names")
    spec = spec.strip()
    if rule == "address":
        return [n for n in names if n == spec]
    if rule == "names":
        wanted = {w.strip() for w in spec.split(",") if w.strip()}
        return [n for n in names if n in wanted]
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    wanted_list = [w.strip() for w in (body[1:] if exact else body).split(",") if w.strip()]
    return [n for n in names if any(n == w if exact else n.startswith(w) for w in wanted_list) != exclude]


def selects(var: str, spec: str, iface: Interface) -> bool:
    """Whether ``var=spec`` lets the backend use ``iface`` (not a substring test: ``^eth0`` excludes eth0)."""
    return bool(matching(var, spec, [iface.address if IFNAME_RULES.get(var) == "address" else iface.name]))


BACKEND_VAR: Mapping[str, str] = MappingProxyType({"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME",
                                  "hccl": "HCCL_IF_IP", "cncl": "CNCL_SOCKET_IFNAME"})


class NetworkError(RuntimeError):
    """No route or interface to the master could be found; the message says what to check."""


@dataclass(frozen=True)
class Route:
    """One line of ``ip -o route get ADDR``."""

    destination: str
    device: str
    source: str | None
    local: bool
    """The destination is an address of this host (the kernel answers through ``lo``)."""


@dataclass(frozen=True)
class Interface:
    name: str
    address: str
    mtu: int | None = None


_ROUTE = re.compile(r"^(?P<local>local\s+)?(?:(?:unicast|broadcast)\s+)?(?P<dest>\S+)\s.*?\bdev\s+(?P<dev>\S+)"
                    r"(?:.*?\bsrc\s+(?P<src>\S+))?")


def parse_route_get(text: str) -> Route:
    """``10.0.0.1 via 10.0.0.254 dev eth1 src 10.0.0.2 uid 0 \\ cache`` -> Route(dev eth1, src 10.0.0.2)."""
    for line in text.splitlines():
        m = _ROUTE.match(line.strip())
        if m:
            return Route(m["dest"], m["dev"], m["src"], bool(m["local"]))
    raise NetworkError(f"no route in `ip route get` output: {text.strip()[:200]!r}")


_ADDR = re.compile(r"^\d+:\s+(?P<dev>[^\s:@]+)(?:@\S+)?\s+inet6?\s+(?P<addr>[^/\s]+)")


def parse_addresses(text: str) -> dict[str, list[str]]:
    """``ip -o addr show`` -> {interface: [addresses]}."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = _ADDR.match(line.strip())
        if m:
            out.setdefault(m["dev"], []).append(m["addr"])
    return out


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def is_unspecified(address: str) -> bool:
    """0.0.0.0 or :: (any spelling): fine to bind, never an address a peer can connect to."""
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_unspecified
    except ValueError:
        return False


def interface_for(route: Route, addresses: Mapping[str, list[str]]) -> Interface:
    """The interface that carries traffic to ``route.destination``.

    The master's own node routes its address through ``lo`` (a local route); its peers reach it on the
    interface that owns that address, so that interface is the one to advertise.
    """
    if route.device == "lo" and not is_loopback(route.destination):
        owners = [name for name, addrs in addresses.items() if route.destination in addrs and name != "lo"]
        if owners:
            return Interface(owners[0], route.destination)
    source = route.source or next(iter(addresses.get(route.device, [])), "")
    if not source:
        raise NetworkError(f"interface {route.device} routes to {route.destination} but has no address")
    return Interface(route.device, source)


def socket_env(iface: Interface, env: Mapping[str, str]) -> dict[str, str]:
    """The interface variables not already in ``env``, pointing every backend at ``iface``."""
    values = {"name": iface.name, "=name": f"={iface.name}", "address": iface.address}
    return {var: values[kind] for var, kind in IFNAME_VARS.items() if not env.get(var, "").strip()}


def _ip(args: list[str], timeout: float = 5.0) -> str:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkError(f"`ip {' '.join(args)}` could not run: {exc} (install iproute2)") from None
    if done.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}`: {done.stderr.strip()[:200]}")
    return done.stdout


def resolve(host: str) -> str:
    """The IPv4 (else IPv6) address ``host`` names."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise NetworkError(f"{host} does not resolve: {exc}") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return str(infos[0][4][0])


def mtu(name: str, root: Path = Path("/")) -> int | None:
    try:
        return int((root / "sys/class/net" / name / "mtu").read_text().strip())
    except (OSError, ValueError):
        return None


def route_to(host: str, ip: Callable[[list[str]], str] = _ip) -> Interface:
    """The interface (name, address, MTU) this host reaches ``host`` through, from the kernel's routes."""
    address = resolve(host)
    route = parse_route_get(ip(["-o", "route", "get", address]))
    iface = interface_for(route, parse_addresses(ip(["-o", "addr", "show"])))
    return Interface(iface.name, iface.address, mtu(iface.name))


def interface_address(name: str, ip: Callable[[list[str]], str] = _ip) -> str | None:
    return next(iter(parse_addresses(ip(["-o", "addr", "show"])).get(name, [])), None)


def gloo_address(env: Mapping[str, str], ip: Callable[[list[str]], str] = _ip) -> tuple[str, str]:
    """The address gloo will advertise and why: GLOO_SOCKET_IFNAME's interface, else the first address the
    hostname resolves to that this host can bind (ProcessGroupGloo::createDefaultDevice)."""
    name = env.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()
    if name:
        return interface_address(name, ip) or "", f"GLOO_SOCKET_IFNAME={name}"
    hostname = socket.gethostname()
    try:
        infos = socket.getaddrinfo(hostname, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except OSError:
        return "127.0.0.1", f"hostname {hostname} (does not resolve; gloo falls back to loopback)"
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as s:
            try:
                s.bind((sockaddr[0], 0))
            except OSError:
                continue
            return str(sockaddr[0]), f"hostname {hostname} resolves to it"
    return "127.0.0.1", f"hostname {hostname} (no bindable address; gloo falls back to loopback)"
