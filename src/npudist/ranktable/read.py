"""The I/O of ``npudist ranktable``: run hccn_tool, read /etc/hccn.conf and /dev, read and write table files.
Everything it learns goes through the pure functions of node.py and table.py."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from npudist.ranktable import node as nd
from npudist.ranktable.table import Node, RankTableError
from npudist.runtime.network import Interface, route_to

TOOL_TIMEOUT_S = 10.0
MAX_TABLE_BYTES = 16 * 1024 * 1024
"""A 4,096-host table is about 2 MiB; anything far larger is not a rank table."""


def hccn_tool(root: Path, env: Mapping[str, str]) -> str | None:
    """hccn_tool on PATH, else the driver's copy under ``root``."""
    found = shutil.which("hccn_tool", path=env.get("PATH", os.defpath))
    driver = root / nd.HCCN_TOOL_DRIVER_PATH.lstrip("/")
    return found or (str(driver) if os.access(driver, os.X_OK) else None)


def ask_hccn(exe: str | None, timeout: float = TOOL_TIMEOUT_S) -> Callable[[int], str | None]:
    """``device -> ipaddr`` from ``hccn_tool -i N -ip -g``; None when the tool is absent, fails or prints no
    address (the caller falls back to /etc/hccn.conf)."""
    from npudist.runtime.toolrun import run_tool
    from npudist.telemetry.sources.hccn.parse import parse_ip

    def ask(device: int) -> str | None:
        if exe is None:
            return None
        try:
            done = run_tool([exe, "-i", str(device), "-ip", "-g"], timeout)
            if done.returncode != 0:
                return None
            return dict(parse_ip(done.stdout)[0].labels)["address"]
        except Exception:  # a hung or garbage-printing tool: try the configuration file instead
            return None

    return ask


def this_node(*, root: Path, env: Mapping[str, str], master_addr: str | None, host_ip: str | None,
              devices: Sequence[int] | None = None, super_pod_id: str | None = None,
              super_device_ids: Sequence[str] | None = None,
              route: Callable[[str], Interface] = route_to,
              ask: Callable[[int], str | None] | None = None) -> Node:
    """This host's rank-table entry, read from ``root`` (``/`` on a real host) and its tools."""
    if host_ip is None:
        if not master_addr:
            raise RankTableError("give --master-addr (the address every node reaches the master by; default "
                                 "$MASTER_ADDR) so the host address is the one on that route, or --host-ip")
        host_ip = nd.host_address(master_addr, route).address
    present = list(devices) if devices else nd.present_devices(root)
    physical = nd.visible_physical(None if devices else env.get(nd.VISIBLE_VAR), present)
    conf_path = root / nd.HCCN_CONF.lstrip("/")
    conf = nd.parse_hccn_conf(conf_path.read_text(errors="replace")) if conf_path.is_file() else {}
    ips = nd.device_ips(physical, ask=ask or ask_hccn(hccn_tool(root, env)), conf=conf)
    return nd.collect(server_id=host_ip, host_ip=host_ip, devices=physical, ips=ips, super_pod_id=super_pod_id,
                      super_device_ids=super_device_ids)


def load(path: Path) -> Any:
    """A table file parsed as JSON; RankTableError naming the file and why it is unreadable."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_TABLE_BYTES + 1)
    except OSError as exc:
        raise RankTableError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_TABLE_BYTES:
        raise RankTableError(f"{path} is larger than {MAX_TABLE_BYTES // 2**20} MiB: not a rank table")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise RankTableError(f"{path} is not JSON: {exc}") from None


def save(table: dict[str, Any], path: Path) -> None:
    """Write atomically: a reader (a rank starting on a shared directory) never sees half a table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table, indent=2) + "\n")
    os.replace(tmp, path)
