"""A small HTTP front for an EnsembleServer on rank 0; the other ranks follow.

    POST /predict   {"inputs": [[f1, ..., fF], ...]}  ->  {"labels": [...], "scores": [[...]], ...}
    GET  /stats     requests, errors and mean latencies so far

One request at a time on the main thread, because every request is a collective over all ranks.
Bad requests get a 400 with the reason and never reach the other ranks.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import torch

from npudist.infer.ensemble import EnsembleError, EnsembleServer

MAX_BODY_BYTES = 8 * 1024 * 1024


class BadRequest(ValueError):
    """The request body is not a batch this ensemble can take; the message is sent to the client."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def parse_batch(body: bytes, features: int | None, max_batch: int) -> torch.Tensor:
    """``{"inputs": [[...], ...]}`` -> [batch, features] float32, or BadRequest saying what is wrong."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict) or "inputs" not in doc:
        raise BadRequest('body must be a JSON object with an "inputs" list: {"inputs": [[f1, ..., fF], ...]}')
    rows = doc["inputs"]
    if not isinstance(rows, list) or not rows:
        raise BadRequest('"inputs" must be a non-empty list of rows')
    if len(rows) > max_batch:
        raise BadRequest(f'"inputs" has {len(rows)} rows; this ensemble takes at most {max_batch} a request')
    if features is None and not isinstance(rows[0], list):
        raise BadRequest('"inputs" must be a list of rows (lists of numbers), e.g. [[0.1, 2.0]]')
    want = features if features is not None else len(rows[0])
    if want < 1:
        raise BadRequest('"inputs" rows must not be empty')
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != want:
            got = f"{len(row)} values" if isinstance(row, list) else type(row).__name__
            raise BadRequest(f'"inputs" must be rows of {want} numbers; row {i} has {got}')
        for j, v in enumerate(row):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise BadRequest(f'"inputs"[{i}][{j}] is {v!r}; every value must be a finite number')
    return torch.tensor(rows, dtype=torch.float32)


def _handler(server: EnsembleServer, allow_shutdown: bool,
             state: dict[str, Any]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a client that stalls mid-body cannot hold the ensemble longer than this

        def log_message(self, format: str, *args: Any) -> None:  # quiet; stats carry the numbers
            pass

        def _send(self, status: int, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path != "/stats":
                self._send(404, {"error": f"no such path {self.path}; POST /predict or GET /stats"})
                return
            s = server.stats
            ok = max(s.requests - s.errors, 1)
            self._send(200, {"requests": s.requests, "errors": s.errors, "bad_requests": state["bad"],
                             "mean_compute_seconds": s.compute_seconds / ok,
                             "mean_aggregate_seconds": s.aggregate_seconds / ok})

        def do_POST(self) -> None:
            if allow_shutdown and self.path == "/shutdown":
                state["stop"] = True
                self._send(200, {"stopping": True})
                return
            if self.path != "/predict":
                self._send(404, {"error": f"no such path {self.path}; POST /predict"})
                return
            try:
                raw = self.headers.get("Content-Length")
                if raw is None or not raw.isdigit():
                    raise BadRequest("send a Content-Length header with the JSON body", 411)
                if int(raw) > MAX_BODY_BYTES:
                    raise BadRequest(f"body of {raw} bytes is over the {MAX_BODY_BYTES}-byte limit", 413)
                batch = parse_batch(self.rfile.read(int(raw)), server.input_features, server.max_batch)
            except BadRequest as exc:
                state["bad"] += 1
                self._send(exc.status, {"error": str(exc)})
                return
            try:
                result = server.request(batch)
            except EnsembleError as exc:
                self._send(500, {"error": str(exc)})
                return
            finally:
                state["last"] = time.monotonic()
            self._send(200, {"labels": result.labels.tolist(), "scores": result.scores.tolist(),
                             "combine": server.combine, "ranks": result.world_size,
                             "latency_seconds": result.latency()})

    return Handler


def serve(server: EnsembleServer, host: str = "127.0.0.1", port: int = 8000, *, idle_seconds: float = 30.0,
          allow_shutdown: bool = False, on_ready: Callable[[int], None] | None = None) -> None:
    """Rank 0 serves HTTP until stopped (POST /shutdown when allowed, or Ctrl-C); other ranks follow.

    While no request comes, rank 0 pings the followers every ``idle_seconds`` so their waiting
    collective never reaches the process group's timeout.
    """
    if server.rank != 0:
        server.follow()
        return
    state: dict[str, Any] = {"stop": False, "bad": 0, "last": time.monotonic()}
    httpd = HTTPServer((host, port), _handler(server, allow_shutdown, state))
    httpd.timeout = idle_seconds / 2
    try:
        if on_ready is not None:
            on_ready(httpd.server_address[1])
        while not state["stop"]:
            httpd.handle_request()
            if time.monotonic() - state["last"] >= idle_seconds / 2:
                server.idle()
                state["last"] = time.monotonic()
    finally:
        httpd.server_close()
        server.stop()
