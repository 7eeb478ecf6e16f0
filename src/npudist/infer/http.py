"""A small HTTP front for an EnsembleServer on rank 0; the other ranks follow.

    POST /predict   {"inputs": [[f1, ..., fF], ...]}  ->  {"labels": [...], "scores": [[...]], ...}
    GET  /stats     requests, errors, bad requests and refusals so far

Requests are read whole (head and body, under a deadline) by the front's own thread and parsed on
its workers; rank 0's main thread only runs the collective (or, with ``member_host``, the fan-out of
npudist.infer.fanout) of each valid request, one at a time, and pings the other ranks while idle. So
no client, however slow, can hold that loop. Bad requests get a 4xx with the reason and never reach the
other ranks; past the connection cap or the queue of pending requests a client gets 503.
"""

from __future__ import annotations

import json
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from npudist.comm import busy
from npudist.httpserve import Front, Limits, Reply, Request
from npudist.infer import fanout
from npudist.infer.ensemble import EnsembleError, EnsembleServer

MAX_BODY_BYTES = 8 * 1024 * 1024
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
REQUEST_TIMEOUT_S = 15.0
"""Whole request, head and body: 8 MiB at 1 MB/s fits; a client trickling bytes does not."""
MAX_PENDING = 16
"""Valid requests waiting for the collective loop; beyond it clients get 503 at once."""


class BadRequest(ValueError):
    """The request body is not a batch this ensemble can take; the message is sent to the client."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _load(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("body is not JSON this server reads: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past Python's int-string limit (sys.get_int_max_str_digits)
        raise BadRequest(f"body is not JSON this server reads: {exc}") from None


def _value(v: Any, where: str) -> float:
    """A JSON number that float32 holds finitely (the members compute in float32), as a float."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BadRequest(f"{where} is {v!r:.40}; every value must be a finite number")
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x) or abs(x) > FLOAT32_MAX:
        raise BadRequest(f"{where} is {str(v)[:40]}; every value must be a finite number within "
                         f"float32's range (magnitude at most {FLOAT32_MAX:.4g})")
    return x


def parse_batch(body: bytes, features: int | None, max_batch: int) -> torch.Tensor:
    """``{"inputs": [[...], ...]}`` -> [batch, features] float32, or BadRequest saying what is wrong."""
    doc = _load(body)
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
    values = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != want:
            got = f"{len(row)} values" if isinstance(row, list) else type(row).__name__
            raise BadRequest(f'"inputs" must be rows of {want} numbers; row {i} has {got}')
        values.append([_value(v, f'"inputs"[{i}][{j}]') for j, v in enumerate(row)])
    return torch.tensor(values, dtype=torch.float32)


def json_reply(status: int, doc: dict[str, Any]) -> Reply:
    return Reply(status, json.dumps(doc, allow_nan=False).encode(), (("Content-Type", "application/json"),))


def error_reply(status: int, message: str) -> Reply:
    return json_reply(status, {"error": message})


def result_reply(server: EnsembleServer | fanout.FanoutFront, result: Any) -> Reply:
    """200 with the prediction; 500 when a member produced non-finite scores (JSON has no NaN).
    ``ranks`` counts the members combined; ``degraded`` says some were left out, ``missing`` which and why."""
    if not bool(torch.isfinite(result.scores).all()):
        return error_reply(500, "the ensemble produced non-finite scores (NaN or inf) for this input; "
                                "check the members on it")
    return json_reply(200, {"labels": result.labels.tolist(), "scores": result.scores.tolist(),
                            "combine": server.combine, "ranks": result.world_size,
                            "degraded": result.degraded, "missing": list(result.missing),
                            "latency_seconds": result.latency()})


@dataclass
class _Service:
    """Rank 0's front: routes on the front's workers, runs predictions on the caller's thread."""

    server: EnsembleServer | fanout.FanoutFront
    allow_shutdown: bool
    front: Front | None = None
    work: queue.Queue = field(default_factory=lambda: queue.Queue(MAX_PENDING))
    stop: threading.Event = field(default_factory=threading.Event)
    bad: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, request: Request) -> Reply | None:
        route = (request.head.method, request.head.path)
        if route == ("GET", "/stats"):
            return json_reply(200, self.stats())
        if route == ("POST", "/shutdown") and self.allow_shutdown:
            self.stop.set()
            return json_reply(200, {"stopping": True})
        if route != ("POST", "/predict"):
            return error_reply(404, f"no such path {request.head.method} {request.head.path[:80]}; "
                                    "POST /predict or GET /stats")
        try:
            if request.head.content_length is None:
                raise BadRequest("send a Content-Length header with the JSON body", 411)
            batch = parse_batch(request.body, self.server.input_features, self.server.max_batch)
        except BadRequest as exc:
            with self._lock:
                self.bad += 1
            return error_reply(exc.status, str(exc))
        try:
            self.work.put_nowait((request, batch))
        except queue.Full:
            return error_reply(503, f"busy: {MAX_PENDING} requests already wait for the ensemble; retry")
        return None

    def stats(self) -> dict[str, Any]:
        s = self.server.stats
        refused = dict(self.front.refused) if self.front else {}  # one C-level copy: the front's thread counts on
        ok = max(s.requests - s.errors, 1)
        malformed = sum(n for status, n in refused.items() if status not in (408, 503))
        doc = {"requests": s.requests, "errors": s.errors, "bad_requests": self.bad + malformed,
               "timed_out_requests": refused.get(408, 0), "refused_busy": refused.get(503, 0),
               "mean_compute_seconds": s.compute_seconds / ok, "mean_aggregate_seconds": s.aggregate_seconds / ok}
        if s.members_expected:
            doc.update(degraded=s.degraded, members_expected=s.members_expected,
                       members_answering=s.members_answering)
        return doc

    def answer(self, request: Request, batch: torch.Tensor) -> None:
        """The collective for one request (this thread), the reply sent by a worker."""
        try:
            reply = result_reply(self.server, self.server.request(batch))
        except EnsembleError as exc:
            reply = error_reply(exc.status, str(exc))
        assert self.front is not None
        self.front.reply_later(request, reply)

    def run(self, idle_seconds: float) -> None:
        last = time.monotonic()
        while not self.stop.is_set():
            try:
                job = self.work.get(timeout=max(0.01, min(0.5, last + idle_seconds / 2 - time.monotonic())))
            except queue.Empty:
                job = None
            if job is not None:
                self.answer(*job)
                last = time.monotonic()
            elif time.monotonic() - last >= idle_seconds / 2:
                self.server.idle()
                last = time.monotonic()

    def drain(self) -> None:
        while True:
            try:
                request, _ = self.work.get_nowait()
            except queue.Empty:
                return
            self.front.reply(request, error_reply(503, "the ensemble is stopping"))  # type: ignore[union-attr]


def serve(server: EnsembleServer, host: str = "127.0.0.1", port: int = 8000, *, idle_seconds: float = 30.0,
          allow_shutdown: bool = False, on_ready: Callable[[int], None] | None = None,
          limits: Limits | None = None, member_host: str | None = None, deadline_s: float = fanout.DEADLINE_S,
          min_members: int | None = None) -> None:
    """Rank 0 serves HTTP until stopped (POST /shutdown when allowed, or Ctrl-C); other ranks follow.

    Without ``member_host`` every request is one collective over the process group, and while no
    request comes rank 0 pings the followers every ``idle_seconds / 2`` so their waiting collective
    never reaches the group's timeout. With ``member_host`` (an address, or ``auto``: the one each
    rank's process group uses) every rank serves its member there and rank 0 fans each request out
    (npudist.infer.fanout): a lost member makes answers degraded instead of failing them, as long as
    ``min_members`` answer within ``deadline_s``; the idle pings probe the members, and a member that
    hears nothing from the front for 20 x ``idle_seconds`` leaves.
    """
    target: EnsembleServer | fanout.FanoutFront = server
    if member_host is not None:
        endpoint, front = fanout.start(server, member_host, deadline_s=deadline_s, min_members=min_members)
        if endpoint is not None:
            fanout.serve_member(endpoint, orphan_s=20 * idle_seconds)
            return
        assert front is not None
        target = front
    elif server.rank != 0:
        server.follow()
        return
    service = _Service(target, allow_shutdown)
    limits = limits or Limits(max_body_bytes=MAX_BODY_BYTES, request_timeout_s=REQUEST_TIMEOUT_S)
    try:
        service.front = Front(host, port, limits, error_reply, name="npudist-infer").start(service.handle)
        if on_ready is not None:
            on_ready(service.front.port)
        # The followers wait in the front's collective between requests: that wait is expected (the hang
        # verdict reports it as declared and never aborts it).
        with busy("serving requests: rank 0 waits for clients"):
            service.run(idle_seconds)
    finally:
        if service.front is not None:
            service.front.close()
            service.drain()
        target.stop()
