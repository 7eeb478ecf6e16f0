"""Serve a registry over HTTP on 127.0.0.1 unless an address is given; clear errors for bad addresses."""

from __future__ import annotations

import errno
import re
import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, start_http_server

DEFAULT_HOST = "127.0.0.1"


class ExporterError(RuntimeError):
    """The exporter cannot start as configured; the message says what to change."""


def parse_listen(text: str, default_port: int | None = None) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``PORT`` (host 127.0.0.1); ``[::1]:PORT`` for IPv6."""
    raw = text.strip()
    m = re.fullmatch(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]*))?:?(?P<port>\d*)", raw)
    if not raw or m is None or (not m.group("port") and default_port is None):
        raise ExporterError(f"--listen {text!r}: expected HOST:PORT such as 127.0.0.1:9400 (0.0.0.0:PORT to "
                            "listen on every interface)")
    host = m.group("v6") or m.group("host") or DEFAULT_HOST
    port = int(m.group("port")) if m.group("port") else int(default_port or 0)
    check_port(port, f"--listen {text!r}")
    return host, port


def check_port(port: int, what: str, allow_zero: bool = False) -> None:
    if not (0 if allow_zero else 1) <= port < 65536:
        raise ExporterError(f"{what}: port {port} is outside 1-65535")


@dataclass
class MetricsServer:
    host: str
    port: int
    _server: object
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()  # type: ignore[attr-defined]
        self._server.server_close()  # type: ignore[attr-defined]
        self._thread.join(5)


def serve(registry: CollectorRegistry, host: str = DEFAULT_HOST, port: int = 0) -> MetricsServer:
    """Start prometheus_client's threaded HTTP server in a daemon thread; port 0 picks a free one."""
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ExporterError(
                f"metrics port {host}:{port} is already in use (another exporter, rank or job holds it). "
                f"Choose another port, or find the holder with `ss -ltnp | grep :{port}`."
            ) from None
        raise ExporterError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return MetricsServer(host, int(server.server_address[1]), server, thread)
