"""Run a WSGI application (prometheus_client's ``make_wsgi_app``) for each request the front read whole."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from npudist.httpserve.front import Handler, Reply, Request, text_error

log = logging.getLogger("npudist.http")

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Any]


def environ(request: Request, server_name: str, server_port: int) -> dict[str, Any]:
    """The WSGI environ (PEP 3333) of a complete request."""
    head = request.head
    env: dict[str, Any] = {
        "REQUEST_METHOD": head.method, "SCRIPT_NAME": "", "PATH_INFO": unquote(head.path, "latin-1"),
        "QUERY_STRING": head.query, "SERVER_NAME": server_name, "SERVER_PORT": str(server_port),
        "SERVER_PROTOCOL": f"HTTP/{head.version}", "REMOTE_ADDR": str(request.peer[0]) if request.peer else "",
        "CONTENT_TYPE": head.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(request.body)),
        "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(request.body),
        "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
    }
    for name, value in head.headers.items():
        key = "HTTP_" + name.upper().replace("-", "_")
        if key not in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"):
            env[key] = f"{env[key]},{value}" if key in env else value
    return env


def call(app: WsgiApp, env: dict[str, Any]) -> Reply:
    """The app's status, headers and body as one Reply; an app that raised is a 500 naming the error."""
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable:
        started[:] = [(status, headers)]
        return lambda _data: None  # the legacy write() callable; make_wsgi_app never uses it

    try:
        chunks = app(env, start_response)
        try:
            body = b"".join(chunks)
        finally:
            getattr(chunks, "close", lambda: None)()
        status, headers = started[0]
        return Reply(int(status.split(None, 1)[0]), body, tuple(headers))
    except Exception as exc:
        log.warning("HTTP app failed on %s %s: %s: %s", env.get("REQUEST_METHOD"), env.get("PATH_INFO"),
                    type(exc).__name__, exc)
        return text_error(500, f"rendering the reply failed: {type(exc).__name__}: {exc}")


def wsgi_handler(app: WsgiApp, server_name: str, server_port: int) -> Handler:
    return lambda request: call(app, environ(request, server_name, server_port))
