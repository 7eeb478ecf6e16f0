"""Doctor checks of how ranks find each other: MASTER_ADDR/MASTER_PORT and the interface variables of
HCCL, NCCL and gloo."""

from __future__ import annotations

import socket

from npudist.doctor.checks import check
from npudist.doctor.host import Host
from npudist.doctor.result import FAIL, OK, SKIP, WARN, CheckResult
from npudist.runtime.env import launcher_env
from npudist.runtime.network import IFNAME_RULES, matching


@check("master-addr")
def master_addr(host: Host) -> list[CheckResult]:
    launcher = launcher_env(host.env)
    addr, port = launcher.master_addr, launcher.master_port
    out = []
    if not addr:
        out.append(CheckResult("master-addr", SKIP, "MASTER_ADDR not set (torchrun/npudist launch set it)"))
    else:
        try:
            ips = host.resolve(addr)
            out.append(CheckResult("master-addr", OK, f"MASTER_ADDR={addr} resolves to {', '.join(ips)}"))
        except OSError as exc:
            out.append(CheckResult("master-addr", FAIL, f"MASTER_ADDR={addr} does not resolve: {exc}",
                                   "use the IP address of rank 0's host, or fix DNS//etc/hosts"))
    if not port:
        out.append(CheckResult("master-port", SKIP, "MASTER_PORT not set"))
    elif not port.isdigit() or not 0 < int(port) < 65536:
        out.append(CheckResult("master-port", FAIL, f"MASTER_PORT={port!r} is not a TCP port", "use 1-65535"))
    else:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", int(port)))
                out.append(CheckResult("master-port", OK, f"MASTER_PORT={port} is free on this host"))
            except OSError:
                out.append(CheckResult("master-port", WARN, f"MASTER_PORT={port} is in use on this host",
                                       "if rank 0 runs here, pick another port or stop the process holding it"))
    return out


@check("network-interfaces")
def network_interfaces(host: Host) -> list[CheckResult]:
    env = host.env
    if not any(env.get(k) for k in IFNAME_RULES):
        return [CheckResult("network-interfaces", SKIP, f"{', '.join(IFNAME_RULES)} unset")]
    ifaces = host.interfaces()
    out = []
    if env.get("HCCL_IF_IP"):
        ip = env["HCCL_IF_IP"].strip()
        owners = [n for n, addrs in ifaces.items() if ip in addrs]
        out.append(CheckResult("HCCL_IF_IP", OK, f"HCCL_IF_IP={ip} is on {owners[0]}") if owners else
                   CheckResult("HCCL_IF_IP", FAIL, f"HCCL_IF_IP={ip} is not an address of this host "
                               f"(have {', '.join(a for v in ifaces.values() for a in v)})",
                               "set HCCL_IF_IP to this host's address on the training network"))
    for var in ("NCCL_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        spec = env.get(var, "").strip()
        if not spec:
            continue
        matched = matching(var, spec, sorted(ifaces))
        out.append(CheckResult(var, OK, f"{var}={spec} selects {', '.join(matched)}") if matched else
                   CheckResult(var, FAIL, f"{var}={spec} matches no interface (have {', '.join(sorted(ifaces))})",
                               f"set {var} to one of the interfaces listed"))
    return out
