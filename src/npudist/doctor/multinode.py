"""The doctor's multi-node checks: the route to the master, the interface it leaves by, its MTU, and
whether the rendezvous port answers (``npudist doctor --master-addr HOST``)."""

from __future__ import annotations

from npudist.doctor.checks import check
from npudist.doctor.host import Host
from npudist.doctor.result import FAIL, OK, SKIP, WARN, CheckResult
from npudist.runtime.env import launcher_env
from npudist.runtime.network import IFNAME_VARS, NetworkError, is_loopback, selects

CONNECT_S = 3.0


@check("route-to-master")
def route_to_master(host: Host) -> list[CheckResult]:
    addr = launcher_env(host.env).master_addr
    if not addr:
        return [CheckResult("route-to-master", SKIP, "no master address (npudist doctor --master-addr HOST)")]
    try:
        iface = host.route(addr)
    except NetworkError as exc:
        return [CheckResult("route-to-master", FAIL, str(exc), f"check `ip route get {addr}` and DNS for {addr}")]
    out = []
    if iface.name == "lo" and not is_loopback(addr):
        out.append(CheckResult("route-to-master", FAIL, f"{addr} routes through lo, yet is not this host's address",
                               f"fix the route to {addr} (`ip route get {addr}`)"))
    else:
        mtu = f", MTU {iface.mtu}" if iface.mtu else ""
        out.append(CheckResult("route-to-master", OK, f"{addr} is reached through {iface.name} ({iface.address}{mtu})"))
        chosen = {v: host.env[v] for v in IFNAME_VARS if host.env.get(v, "").strip()}
        wrong = {v: s for v, s in chosen.items() if not selects(v, s, iface)}
        if wrong and iface.name != "lo":
            out.append(CheckResult("interface-variables", WARN, "set to another interface than the route to the "
                                   f"master: {', '.join(f'{k}={v}' for k, v in wrong.items())}",
                                   f"use {iface.name} ('^' excludes the interfaces it lists), or unset them and "
                                   "let `npudist launch` choose"))
        if iface.mtu and iface.name != "lo" and iface.mtu < 1500:
            out.append(CheckResult("mtu", WARN, f"{iface.name} MTU {iface.mtu} is below Ethernet's 1500 (an overlay "
                                   "or tunnel): large collectives are split into more packets",
                                   f"check that every node's {iface.name} has the same MTU"))
    out.append(_port(host, addr))
    return out


def _port(host: Host, addr: str) -> CheckResult:
    raw = launcher_env(host.env).master_port or "29500"
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        return CheckResult("rendezvous-port", FAIL, f"MASTER_PORT={raw!r} is not a TCP port", "use 1-65535")
    try:
        host.connect(addr, int(raw), CONNECT_S)
    except ConnectionRefusedError:
        return CheckResult("rendezvous-port", WARN, f"{addr}:{raw} refused the connection: nothing listens there yet",
                           "fine before node 0 starts; once it runs, check --master-port on every node")
    except TimeoutError:
        return CheckResult("rendezvous-port", FAIL, f"{addr}:{raw} did not answer in {CONNECT_S:.0f} s",
                           "a firewall drops the port, or the master is down or partitioned")
    except OSError as exc:
        return CheckResult("rendezvous-port", FAIL, f"{addr}:{raw} unreachable: {exc}",
                           f"check the route and link to {addr}")
    return CheckResult("rendezvous-port", OK, f"{addr}:{raw} accepts connections")
