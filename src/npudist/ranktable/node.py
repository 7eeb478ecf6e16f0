"""This node's entry of an HCCL rank table: which physical devices the job uses, each one's NIC address, and
the host address the other nodes reach this one by.

- Physical device IDs: ``ASCEND_RT_VISIBLE_DEVICES`` lists *logical* IDs, which index the devices present
  (``/dev/davinciN``, in ascending N); in a container they differ from the physical IDs the rank table needs
  (CANN runtime API, aclrtGetPhyDevIdByLogicDevId, "Relationships Between the User Device ID, Logical Device
  ID, and Physical Device ID": logical 1 in a container may be physical 6). The IDs must be ascending (CANN
  env var reference envref_07_0028, ASCEND_RT_VISIBLE_DEVICES).
- Device NIC addresses: ``hccn_tool -i N -ip -g`` (``ipaddr:A.B.C.D``), else ``address_N`` in
  ``/etc/hccn.conf``, the order Huawei's hccl_tools.py tries them in.
- Host address: the interface the kernel routes to the master through (npudist.runtime.network.route_to,
  as launch uses), never a loopback address. hccl_tools.py takes ``gethostbyname(gethostname())``, which is
  127.0.1.1 on a default Debian/Ubuntu /etc/hosts: every peer would then dial itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from npudist.ranktable.table import Device, Node, RankTableError
from npudist.runtime.network import Interface, NetworkError, is_loopback

VISIBLE_VAR = "ASCEND_RT_VISIBLE_DEVICES"
HCCN_CONF = "/etc/hccn.conf"
HCCN_TOOL_DRIVER_PATH = "/usr/local/Ascend/driver/tools/hccn_tool"
_DAVINCI = re.compile(r"davinci(\d+)")
_ADDRESS = re.compile(r"^\s*address_(\d+)\s*=\s*(\S+)\s*$", re.M)


def present_devices(root: Path) -> list[int]:
    """Physical IDs of the devices this host (or container) holds: ``/dev/davinciN``, ascending."""
    dev = root / "dev"
    found = [int(m.group(1)) for p in (dev.iterdir() if dev.is_dir() else ()) if (m := _DAVINCI.fullmatch(p.name))]
    return sorted(found)


def visible_physical(raw: str | None, present: Sequence[int]) -> list[int]:
    """The physical IDs a job sees: ``present`` indexed by ``ASCEND_RT_VISIBLE_DEVICES``'s logical IDs, or
    all of ``present`` when it is unset. RankTableError when the value is one the runtime would cut short
    or drop devices from (a space, a non-number, out of range, not ascending)."""
    if not present:
        raise RankTableError("no /dev/davinciN device here: run on an Ascend host (or mount the devices into "
                             "the container), or name the physical devices with --devices")
    if raw is None or not raw.strip():
        return list(present)
    tokens = raw.split(",")
    if not all(t.isdigit() for t in tokens):
        # The runtime reads up to the first token that is not a number and drops the rest silently.
        raise RankTableError(f"{VISIBLE_VAR}={raw!r}: only comma-separated logical IDs without spaces are read "
                             f"whole (the runtime stops at the first other character); write e.g. 0,1,2,3")
    logical = [int(t) for t in tokens]
    if logical != sorted(set(logical)):
        raise RankTableError(f"{VISIBLE_VAR}={raw}: the IDs must be ascending and distinct (the runtime supports "
                             f"only ascending order); write {','.join(map(str, sorted(set(logical))))}")
    if logical[-1] >= len(present):
        raise RankTableError(f"{VISIBLE_VAR}={raw}: logical ID {logical[-1]} is out of range, {len(present)} "
                             f"device(s) are present (physical {','.join(map(str, present))}); logical IDs "
                             f"are 0..{len(present) - 1}")
    return [present[i] for i in logical]


def parse_hccn_conf(text: str) -> dict[int, str]:
    """``/etc/hccn.conf``: {physical device: ``address_N``}."""
    return {int(n): addr for n, addr in _ADDRESS.findall(text)}


def host_address(master_addr: str, route: Callable[[str], Interface]) -> Interface:
    """The interface (and address) this node reaches ``master_addr`` through; RankTableError for loopback."""
    try:
        iface = route(master_addr)
    except NetworkError as exc:
        raise RankTableError(f"cannot find the interface towards the master {master_addr}: {exc}; "
                             "or give --host-ip") from None
    if is_loopback(iface.address):
        raise RankTableError(f"the route to the master {master_addr} leaves through {iface.name} "
                             f"({iface.address}), a loopback address other hosts cannot reach: give "
                             "--master-addr as the address the other nodes use (not localhost or a name "
                             "that resolves to 127.x, as /etc/hosts often maps the host name), or --host-ip")
    return iface


def device_ips(devices: Sequence[int], *, ask: Callable[[int], str | None], conf: Mapping[int, str]) -> list[str]:
    """Each device's NIC address, from ``ask`` (hccn_tool) else ``conf`` (/etc/hccn.conf); RankTableError
    naming every device that has none, with the command that sets it."""
    out, missing = [], []
    for n in devices:
        ip = ask(n) or conf.get(n)
        if ip is None:
            missing.append(n)
        out.append(ip or "")
    if missing:
        ids = ",".join(map(str, missing))
        raise RankTableError(f"device(s) {ids} have no NIC address (`hccn_tool -i N -ip -g` gave none and "
                             f"{HCCN_CONF} has no address_N): HCCL cannot link them to other hosts. Set each "
                             "with `hccn_tool -i N -ip -s address A.B.C.D netmask M` (Ascend's network "
                             "configuration guide) and run this again")
    return out


def collect(*, server_id: str, host_ip: str, devices: Sequence[int], ips: Sequence[str],
            super_pod_id: str | None = None, super_device_ids: Sequence[str] | None = None) -> Node:
    """This node's rank-table entry, devices in the order their ranks will take."""
    if is_loopback(host_ip) or is_loopback(server_id):
        raise RankTableError(f"host address {host_ip} is loopback: other hosts cannot reach it; give the "
                             "address of the interface towards the master")
    if super_device_ids is not None and len(super_device_ids) != len(devices):
        raise RankTableError(f"--super-device-ids gives {len(super_device_ids)} IDs for {len(devices)} devices")
    supers = list(super_device_ids) if super_device_ids is not None else [None] * len(devices)
    return Node(server_id=server_id, host_ip=host_ip, super_pod_id=super_pod_id,
                devices=tuple(Device(d, ip, s) for d, ip, s in zip(devices, ips, supers, strict=True)))
