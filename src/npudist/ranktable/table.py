"""The HCCL rank table: building one from per-node records, and checking one, field by field.

The format, from Huawei's HCCL user guide (CANN 9.0.0, "Rank Table Configuration", hcclug_000067 for
version 1.0 on Atlas A2 / training products and hcclug_000066 for version 1.2 on Atlas A3 SuperPoDs,
https://www.hiascend.com/document/detail/en/CANNCommunityEdition/900/API/hcclug/hcclug_000066.html):

- top level: ``status`` ("completed" means usable, "initializing" not yet), ``version`` ("1.0" or "1.2"),
  ``server_count`` (a string: the number of entries in ``server_list``), ``server_list``;
- a server: ``server_id`` (a string, globally unique), ``device`` (its list); version 1.2 adds ``host_ip``;
- a device: ``device_id`` (the processor's *physical* ID), ``device_ip`` (its NIC address, set with
  ``hccn_tool -i N -ip -s``), ``rank_id`` (from 0, globally unique); version 1.2 adds ``super_device_id``;
- version 1.2 adds ``super_pod_list``: ``[{"super_pod_id": ..., "server_list": [{"server_id": ...}]}]``.

Every value is a string, as the guide's examples and Huawei's own generator (mindspore-ai/models
``utils/hccl_tools/hccl_tools.py``) write them. Ranks of one SuperPoD must be contiguous (CANN env var
reference, HCCL_LOGIC_SUPERPOD_ID: "rank ids of one logical SuperPoD are laid out contiguously"). The
checks are pure: a parsed document in, a list of Defects (each naming its field) out.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

VERSIONS = ("1.0", "1.2")
"""1.0: Atlas A2 and training products; 1.2: Atlas A3 SuperPoD networking."""


@dataclass(frozen=True)
class Device:
    device_id: int
    """Physical device ID (``/dev/davinciN``), not the logical index a process sees."""
    device_ip: str
    super_device_id: str | None = None


@dataclass(frozen=True)
class Node:
    """One server's entry, before ranks are numbered: its address and its devices in rank order."""

    server_id: str
    host_ip: str
    devices: tuple[Device, ...]
    super_pod_id: str | None = None


@dataclass(frozen=True)
class Defect:
    field: str
    """Where, as a path: ``server_list[1].device[3].device_ip``."""
    problem: str
    fix: str

    def line(self) -> str:
        return f"{self.field}: {self.problem} (fix: {self.fix})"


class RankTableError(ValueError):
    """A rank table cannot be built or read; the message names what and how to fix it."""


def build(nodes: Sequence[Node]) -> dict[str, Any]:
    """The rank table for ``nodes`` in order: rank IDs 0..N-1 node by node, version 1.2 when any node is in a
    SuperPoD (then all must be)."""
    pods = [n.super_pod_id for n in nodes]
    if any(p is not None for p in pods) and None in pods:
        raise RankTableError("some nodes name a SuperPoD and some do not: give --super-pod-id on every node "
                             "(version 1.2) or on none (version 1.0)")
    version = "1.2" if nodes and pods[0] is not None else "1.0"
    servers, rank = [], 0
    for node in nodes:
        devices = []
        for d in node.devices:
            entry = {"device_id": str(d.device_id), "device_ip": d.device_ip, "rank_id": str(rank)}
            if version == "1.2":
                if d.super_device_id is None:
                    raise RankTableError(f"{node.server_id} device {d.device_id} has no super_device_id: "
                                         "give --super-device-ids (version 1.2 needs one per device)")
                entry["super_device_id"] = d.super_device_id
            devices.append(entry)
            rank += 1
        server: dict[str, Any] = {"server_id": node.server_id, "device": devices}
        if version == "1.2":
            server["host_ip"] = node.host_ip
        servers.append(server)
    table: dict[str, Any] = {"status": "completed", "version": version, "server_count": str(len(nodes)),
                             "server_list": servers}
    if version == "1.2":
        order = list(dict.fromkeys(pods))
        table["super_pod_list"] = [{"super_pod_id": p, "server_list": [{"server_id": n.server_id}
                                                                        for n in nodes if n.super_pod_id == p]}
                                   for p in order]
    return table


def nodes_of(table: dict[str, Any]) -> list[Node]:
    """The nodes of a table that passed check(), in server order (to merge one-node tables)."""
    pods = {s["server_id"]: p["super_pod_id"] for p in table.get("super_pod_list", []) for s in p["server_list"]}
    return [Node(server_id=s["server_id"], host_ip=s.get("host_ip", s["server_id"]),
                 devices=tuple(Device(int(d["device_id"]), d["device_ip"], d.get("super_device_id"))
                               for d in s["device"]),
                 super_pod_id=pods.get(s["server_id"])) for s in table["server_list"]]


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _loopback(value: Any) -> bool:
    try:
        return ipaddress.ip_address(str(value)).is_loopback
    except ValueError:
        return False


def _ip(value: Any) -> bool:
    try:
        ipaddress.ip_address(str(value))
    except ValueError:
        return False
    return True


_NIC_FIX = ("configure the NIC on that host (hccn_tool -i DEVICE_ID -ip -s address A.B.C.D netmask M, or "
            "address_N in /etc/hccn.conf) and write the table again: npudist ranktable write")
_LOOPBACK_FIX = ("use the address other hosts reach this one by (npudist ranktable write takes it from the "
                 "interface that routes to the master); a host name resolving to 127.0.1.1 is the usual cause")


def check(table: Any) -> list[Defect]:
    """Every defect of a parsed rank table; [] means HCCL can read it."""
    if not isinstance(table, dict):
        return [Defect("(top level)", f"is a JSON {type(table).__name__}, not an object",
                       "write the table with npudist ranktable write")]
    out = _top(table)
    servers = table.get("server_list")
    if not isinstance(servers, list) or not servers:
        return [*out, Defect("server_list", "missing or empty", "list one entry per host")]
    if _int(table.get("server_count")) not in (None, len(servers)):
        out.append(Defect("server_count", f"says {table['server_count']} but server_list has {len(servers)} "
                          "entries", f'set "server_count": "{len(servers)}"'))
    ranks: list[tuple[int, str]] = []
    ips: Counter[str] = Counter()
    for i, server in enumerate(servers):
        out += _server(table.get("version"), f"server_list[{i}]", server, ranks, ips)
    ids = Counter(s.get("server_id") for s in servers if isinstance(s, dict))
    out += [Defect(f"server_list[{i}].server_id", f"{s.get('server_id')!r} appears {ids[s.get('server_id')]} times",
                   "give each host a unique server_id (its address)")
            for i, s in enumerate(servers) if isinstance(s, dict) and ids[s.get("server_id")] > 1]
    out += _ranks(ranks)
    out += [Defect(f, f"{ip} is used by {ips[ip]} devices", "each device NIC needs its own address")
            for f, ip in _ip_fields(servers) if ips[ip] > 1]
    if table.get("version") == "1.2":
        out += _super_pods(table, servers)
    return out


def _top(table: dict[str, Any]) -> list[Defect]:
    out = []
    if table.get("status") != "completed":
        out.append(Defect("status", f"is {table.get('status')!r}: HCCL uses a table only when it is \"completed\"",
                          'set "status": "completed" once every host is in the table'))
    if table.get("version") not in VERSIONS:
        out.append(Defect("version", f"is {table.get('version')!r}, not one of {', '.join(VERSIONS)}",
                          '"1.0" for Atlas A2/training servers, "1.2" for Atlas A3 SuperPoDs'))
    if _int(table.get("server_count")) is None:
        out.append(Defect("server_count", f"is {table.get('server_count')!r}, not a count written as a string",
                          'write the number of servers as a string, e.g. "2"'))
    return out


def _server(version: Any, where: str, server: Any, ranks: list[tuple[int, str]], ips: Counter[str]) -> list[Defect]:
    if not isinstance(server, dict):
        return [Defect(where, "is not an object", "each server is {server_id, device: [...]}")]
    out = []
    sid = server.get("server_id")
    if not isinstance(sid, str) or not sid:
        out.append(Defect(f"{where}.server_id", "missing", "name the host by its address"))
    elif _loopback(sid):
        out.append(Defect(f"{where}.server_id", f"{sid} is a loopback address", _LOOPBACK_FIX))
    if version == "1.2":
        host = server.get("host_ip")
        if not _ip(host):
            out.append(Defect(f"{where}.host_ip", f"is {host!r}, not an IP address",
                              "version 1.2 needs each host's address in host_ip"))
        elif _loopback(host):
            out.append(Defect(f"{where}.host_ip", f"{host} is a loopback address", _LOOPBACK_FIX))
    devices = server.get("device")
    if not isinstance(devices, list) or not devices:
        return [*out, Defect(f"{where}.device", "missing or empty", "list the host's devices")]
    seen: Counter[int] = Counter()
    for j, dev in enumerate(devices):
        at = f"{where}.device[{j}]"
        if not isinstance(dev, dict):
            out.append(Defect(at, "is not an object", "each device is {device_id, device_ip, rank_id}"))
            continue
        phys = _int(dev.get("device_id"))
        if phys is None:
            out.append(Defect(f"{at}.device_id", f"is {dev.get('device_id')!r}, not a physical device number",
                              "use the N of /dev/davinciN, as a string"))
        else:
            seen[phys] += 1
            if seen[phys] == 2:
                out.append(Defect(f"{at}.device_id", f"device {phys} is listed twice on this host",
                                  "list each physical device once"))
        ip = dev.get("device_ip")
        if not _ip(ip):
            out.append(Defect(f"{at}.device_ip", f"is {ip!r}: the device's NIC has no address", _NIC_FIX))
        else:
            ips[str(ip)] += 1
        if version == "1.2" and _int(dev.get("super_device_id")) is None:
            out.append(Defect(f"{at}.super_device_id", f"is {dev.get('super_device_id')!r}, not a number",
                              "version 1.2 needs each device's SuperPoD ID (npu-smi info -t spod-info)"))
        rank = _int(dev.get("rank_id"))
        if rank is None:
            out.append(Defect(f"{at}.rank_id", f"is {dev.get('rank_id')!r}, not a rank number",
                              "number the ranks 0..N-1 as strings"))
        else:
            ranks.append((rank, f"{at}.rank_id"))
    return out


def _ranks(ranks: list[tuple[int, str]]) -> list[Defect]:
    counts = Counter(r for r, _ in ranks)
    out = [Defect(f, f"rank {r} is also given to another device", "give each device its own rank_id, 0..N-1")
           for r, f in ranks if counts[r] > 1]
    if not out:
        n = len(ranks)
        out += [Defect(f, f"rank {r} is outside 0..{n - 1} ({n} devices)", "number the ranks 0..N-1 without gaps")
                for r, f in ranks if r >= n]
    return out


def _ip_fields(servers: list[Any]) -> list[tuple[str, str]]:
    return [(f"server_list[{i}].device[{j}].device_ip", str(d.get("device_ip")))
            for i, s in enumerate(servers) if isinstance(s, dict) and isinstance(s.get("device"), list)
            for j, d in enumerate(s["device"]) if isinstance(d, dict) and _ip(d.get("device_ip"))]


def _super_pods(table: dict[str, Any], servers: list[Any]) -> list[Defect]:
    pods = table.get("super_pod_list")
    if not isinstance(pods, list) or not pods:
        return [Defect("super_pod_list", "missing or empty in a version 1.2 table",
                       "list each SuperPoD and its servers, or write version 1.0 for servers outside SuperPoDs")]
    by_id = {s.get("server_id"): s for s in servers if isinstance(s, dict)}
    placed: Counter[Any] = Counter()
    out = []
    for i, pod in enumerate(pods):
        members = pod.get("server_list") if isinstance(pod, dict) else None
        if not isinstance(members, list) or not members:
            out.append(Defect(f"super_pod_list[{i}].server_list", "missing or empty", "name the pod's servers"))
            continue
        pod_ranks = []
        for j, m in enumerate(members):
            sid = m.get("server_id") if isinstance(m, dict) else None
            placed[sid] += 1
            if sid not in by_id:
                out.append(Defect(f"super_pod_list[{i}].server_list[{j}].server_id",
                                  f"{sid!r} is not in server_list", "name servers of server_list only"))
                continue
            pod_ranks += [r for d in by_id[sid].get("device", []) if isinstance(d, dict)
                          and (r := _int(d.get("rank_id"))) is not None]
        if pod_ranks and sorted(pod_ranks) != list(range(min(pod_ranks), min(pod_ranks) + len(pod_ranks))):
            out.append(Defect(f"super_pod_list[{i}]", f"SuperPoD {pod.get('super_pod_id')!r} holds ranks "
                              f"{_span(sorted(pod_ranks))}, not one contiguous run",
                              "number the ranks of one SuperPoD consecutively (server order within the pod)"))
    out += [Defect("super_pod_list", f"server {sid!r} is in {placed[sid]} SuperPoDs" if placed[sid] else
                   f"server {sid!r} is in no SuperPoD", "put each server in exactly one SuperPoD")
            for sid in by_id if placed[sid] != 1]
    return out


def _span(ranks: list[int]) -> str:
    shown = ",".join(map(str, ranks[:12]))
    return shown + ("..." if len(ranks) > 12 else "")
