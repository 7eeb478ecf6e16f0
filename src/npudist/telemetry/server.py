"""Serve a registry over HTTP on 127.0.0.1 unless an address is given; clear errors for bad addresses."""

from __future__ import annotations

import errno
import re
import socket
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.exposition import ThreadingWSGIServer

DEFAULT_HOST = "127.0.0.1"


class ExporterError(RuntimeError):
    """The exporter cannot start as configured; the message says what to change."""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``PORT`` (host 127.0.0.1); ``[::1]:PORT`` for IPv6."""
    raw = text.strip()
    if re.fullmatch(r"[0-9]+", raw):  # not str.isdigit(): it accepts "²", which int() refuses
        host, port = DEFAULT_HOST, raw
    else:
        m = re.fullmatch(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]\s]*)):(?P<port>[0-9]+)", raw)
        if m is None:
            raise ExporterError(f"--listen {text!r}: expected HOST:PORT such as 127.0.0.1:9400 "
                                "(0.0.0.0:PORT to listen on every interface)")
        host, port = m.group("v6") or m.group("host") or DEFAULT_HOST, m.group("port")
    check_port(int(port), f"--listen {text!r}")
    return host, int(port)


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


class CoalescingApp:
    """WSGI app rendering the registry once for all scrapes that arrive while a render is running.

    With 20 concurrent scrapers each render would otherwise run 20 times over under the GIL; the
    shared result is never older than the render the waiting scrape arrived during.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._cond = threading.Condition()
        self._rendering = False
        self._generation = 0
        self._body = b""

    def render(self) -> bytes:
        with self._cond:
            if self._rendering:
                seen = self._generation
                while self._generation == seen:
                    self._cond.wait()
                return self._body
            self._rendering = True
        body = b""
        try:
            body = generate_latest(self.registry)
        finally:
            with self._cond:
                self._body, self._rendering = body, False
                self._generation += 1
                self._cond.notify_all()
        return body

    def __call__(self, environ: dict, start_response: object) -> list[bytes]:
        body = self.render()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST),  # type: ignore[operator]
                                  ("Content-Length", str(len(body)))])
        return [body]


class _Server(ThreadingWSGIServer):
    # socketserver listens with a backlog of 5: 20 scrapers arriving together overflow it and the
    # dropped SYNs are retried after 1 s, which showed up as 1 s p99 latencies in benchmarks/.
    request_queue_size = 128


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no access log on stderr per scrape
        pass


def serve(registry: CollectorRegistry, host: str = DEFAULT_HOST, port: int = 0) -> MetricsServer:
    """Serve ``registry`` at /metrics from a threaded HTTP server in a daemon thread; port 0 picks one."""
    server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6}) if ":" in host else _Server
    try:
        server = make_server(host, port, CoalescingApp(registry), server_cls, handler_class=_QuietHandler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ExporterError(
                f"metrics port {host}:{port} is already in use (another exporter, rank or job holds it). "
                f"Choose another port, or find the holder with `ss -ltnp | grep :{port}`."
            ) from None
        raise ExporterError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    thread = threading.Thread(target=server.serve_forever, name="npudist-metrics", daemon=True)
    thread.start()
    return MetricsServer(host, int(server.server_address[1]), server, thread)
