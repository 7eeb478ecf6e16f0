"""Prometheus file_sd targets for the ranks `npudist launch` starts on this node.

Format: a JSON list of {"targets": ["host:port", ...], "labels": {...}} groups
(https://prometheus.io/docs/prometheus/latest/configuration/configuration/#file_sd_config).
Only `job` is set as a target label: rank, local_rank and node come from the ranks' own metrics, and
a target label of the same name would make Prometheus rename the exposed one to exported_<name>.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from npudist.telemetry.exposition.server import check_port


def target_host(bind_host: str) -> str:
    """Address Prometheus should scrape: the bind address, or this host's name for a wildcard bind."""
    return socket.gethostname() if bind_host in ("0.0.0.0", "::", "") else bind_host


def rank_ports(base_port: int, nproc: int) -> list[int]:
    """Rank ``local_rank`` serves on ``base_port + local_rank``."""
    check_port(base_port, "--metrics-port")
    check_port(base_port + nproc - 1, f"--metrics-port {base_port} with {nproc} ranks")
    return [base_port + i for i in range(nproc)]


def targets_document(host: str, ports: list[int], job: str = "npudist") -> list[dict[str, object]]:
    addr = f"[{host}]" if ":" in host else host
    return [{"targets": [f"{addr}:{p}" for p in ports], "labels": {"job": job}}]


def write_targets(path: str | os.PathLike[str], document: list[dict[str, object]]) -> Path:
    """Write atomically (Prometheus watches the file and must never read half of it)."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(tmp, dest)
    return dest
