"""The world the doctor inspects, injectable so every check runs against a fabricated host in tests."""

from __future__ import annotations

import os
import resource
import shutil
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from npudist.doctor.npu_probe import npu_count
from npudist.runtime.network import Interface, route_to
from npudist.runtime.toolrun import run_tool


def _interfaces() -> dict[str, list[str]]:
    import psutil

    return {name: [a.address for a in addrs] for name, addrs in psutil.net_if_addrs().items()}


def _run(argv: list[str], timeout: float) -> str:
    """Run a vendor tool; its own errors become empty output, the doctor reports the tool as unusable."""
    done = run_tool(argv, timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout


def _fs_size(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_frsize * st.f_blocks


def _resolve(host: str) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, None)})


def _connect(host: str, port: int, timeout: float) -> None:
    socket.create_connection((host, port), timeout=timeout).close()


def _port_free(port: int) -> bool:
    """Whether a listener could bind ``port`` on every address now (what HCCL's host NIC ports need)."""
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@dataclass
class Host:
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    root: Path = Path("/")
    """Where /dev/shm and other absolute files are read from."""
    nofile: Callable[[], tuple[int, int]] = lambda: resource.getrlimit(resource.RLIMIT_NOFILE)
    interfaces: Callable[[], dict[str, list[str]]] = _interfaces
    resolve: Callable[[str], list[str]] = _resolve
    run: Callable[[list[str], float], str] = _run
    fs_size: Callable[[Path], int] = _fs_size
    tool_timeout: float = 10.0
    route: Callable[[str], Interface] = route_to
    connect: Callable[[str, int, float], None] = _connect
    port_free: Callable[[int], bool] = _port_free
    npu_count: Callable[[Mapping[str, str]], int | None] = npu_count
    """``torch.npu.device_count()`` under an environment (npu_probe.py: a child with a timeout); None where
    neither torch_npu nor the simulated NPU is importable."""

    def which(self, tool: str) -> str | None:
        return shutil.which(tool, path=self.env.get("PATH", os.defpath))

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")
