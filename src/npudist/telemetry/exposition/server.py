"""Serve a registry over HTTP on 127.0.0.1 unless an address is given; clear errors for bad addresses.

Only ``0.0.0.0`` or ``::`` spelled out listen on every interface (``0:9400`` is refused, not widened)."""

from __future__ import annotations

import errno
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import Metric

from npudist.httpserve import Front, Limits, binds_everything_unasked, wsgi_handler

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
    if binds_everything_unasked(host):
        raise ExporterError(f"--listen {text!r}: {host!r} would listen on every interface; write "
                            f"0.0.0.0:{port} (or [::]:{port}) to mean that, or 127.0.0.1:{port} for this host only")
    check_port(int(port), f"--listen {text!r}")
    return host, int(port)


def check_port(port: int, what: str, allow_zero: bool = False) -> None:
    if not (0 if allow_zero else 1) <= port < 65536:
        raise ExporterError(f"{what}: port {port} is outside 1-65535")


@dataclass
class MetricsServer:
    host: str
    port: int
    front: Front

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving: the port is closed and the server's threads have ended when this returns."""
        self.front.close(wait=True)


class _NameFilter:
    """The registry as make_wsgi_app sees it, with ``name[]`` filtering that keeps working for collectors
    without describe(): CollectorRegistry.restricted_registry finds collectors only by described name."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.names: frozenset[str] | None = None

    def restricted_registry(self, names: Iterable[str]) -> _NameFilter:
        only = _NameFilter(self.registry)
        only.names = frozenset(names)
        return only

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            if self.names is None:
                yield metric
                continue
            kept = [s for s in metric.samples if s.name in self.names]
            if kept:
                only = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                only.samples = kept
                yield only


@dataclass
class _Render:
    done: threading.Event = field(default_factory=threading.Event)
    result: tuple[str, list[tuple[str, str]], bytes] | None = None
    error: BaseException | None = None


# What makes two scrapes' answers differ: the format negotiated, gzip, and the name[] filter.
_RENDER_KEY = ("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "HTTP_ACCEPT", "HTTP_ACCEPT_ENCODING")
_KEPT_MAX = 8
"""Answers kept at most (Accept headers vary by client; answers to name[] queries are never kept)."""


class CoalescedApp:
    """WSGI middleware: scrapes that arrive while an identical one renders share its answer.

    With 20 concurrent scrapers each render would otherwise run 20 times over under the GIL; a shared
    answer is never older than the render the waiting scrape arrived during. A render that raised
    fails every scrape that waited on it (the server answers 500), never an empty 200.
    """

    def __init__(self, app: Callable[..., Any], max_age_s: float = 0.0) -> None:
        self.app = app
        self.max_age_s = max_age_s
        """0: every scrape waits for a render started after it arrived (or shares one). Above 0: an answer up
        to this old is served as is, and an older one is still served while a background render replaces it,
        so no scrape waits for a render except the first of its kind (a node exporter's data changes only
        every poll interval; rendering a thousand reliability series costs tens of milliseconds)."""
        self._lock = threading.Lock()
        self._running: dict[tuple[str, ...], _Render] = {}
        self._kept: dict[tuple[str, ...], tuple[float, tuple[str, list[tuple[str, str]], bytes]]] = {}

    def _lead(self, key: tuple[str, ...], render: _Render, environ: dict[str, Any]) -> None:
        try:
            render.result = self._render(environ)
            if self.max_age_s > 0 and render.result[0].startswith("200") and not environ.get("QUERY_STRING"):
                with self._lock:
                    if len(self._kept) >= _KEPT_MAX and key not in self._kept:
                        self._kept.pop(next(iter(self._kept)))
                    self._kept[key] = (time.monotonic(), render.result)
        except Exception as exc:
            render.error = exc
        finally:
            with self._lock:
                del self._running[key]
            render.done.set()

    def _from_kept(self, key: tuple[str, ...], environ: dict[str, Any]
                   ) -> tuple[str, list[tuple[str, str]], bytes] | None:
        """A kept answer for ``key``; past max_age_s it is still returned while one background render
        (started here unless one runs) replaces it. None when nothing is kept, or it is past 2 x max_age_s."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                return None
            age = time.monotonic() - kept[0]
            if age <= self.max_age_s:
                return kept[1]
            if age > 2 * self.max_age_s:
                return None  # the refresh is failing or stuck: make this scrape wait for a fresh render
            if key not in self._running:
                render = self._running[key] = _Render()
                threading.Thread(target=self._lead, args=(key, render, environ), name="npudist-render",
                                 daemon=True).start()
            return kept[1]

    def _render(self, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
        started: list[Any] = []
        body = b"".join(self.app(environ, lambda status, headers, exc_info=None: started.extend((status, headers))))
        return started[0], started[1], body

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        key = tuple(str(environ.get(k, "")) for k in _RENDER_KEY)
        if self.max_age_s > 0:
            kept = self._from_kept(key, dict(environ))
            if kept is not None:
                status, headers, body = kept
                start_response(status, headers)
                return [body]
        with self._lock:
            render = self._running.get(key)
            leader = render is None
            if render is None:
                render = self._running[key] = _Render()
        if leader:
            self._lead(key, render, environ)
        else:
            render.done.wait()
        if render.result is None:
            raise RuntimeError(f"metrics render failed: {render.error!r}") from render.error
        status, headers, body = render.result
        start_response(status, headers)
        return [body]


def serve(registry: CollectorRegistry, host: str = DEFAULT_HOST, port: int = 0,
          limits: Limits | None = None, max_age_s: float = 0.0) -> MetricsServer:
    """Serve ``registry`` (prometheus_client's WSGI app: text or OpenMetrics, gzip, ``name[]``) from a
    front that reads each request whole under a deadline and caps connections; port 0 picks one."""
    try:
        front = Front(host, port, limits, name="npudist-metrics")
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ExporterError(
                f"metrics port {host}:{port} is already in use (another exporter, rank or job holds it). "
                f"Choose another port, or find the holder with `ss -ltnp | grep :{port}`."
            ) from None
        raise ExporterError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    front.start(wsgi_handler(CoalescedApp(make_wsgi_app(_NameFilter(registry)), max_age_s), front.host, front.port))
    return MetricsServer(front.host, front.port, front)
