"""Cooperative inference that survives a lost board: rank 0 sends each request to every member over its
own connection and combines the answers that came back within a deadline.

A process group cannot lose a member: after a peer dies, gloo, HCCL and NCCL fail every later collective
of the group, and a new group needs every old rank to take part. So this front does not serve through
one: each rank serves its member over HTTP on its own address (``MemberEndpoint``), the addresses are
exchanged once at start through one collective while every rank is alive, and rank 0's ``FanoutFront``
asks each member on its own. A member that died, was cut off, missed the deadline or failed on the
request is left out of that answer, which says so (``degraded``, ``missing``) instead of failing; the
request fails only when fewer than ``min_members`` answered (503). A member that could not be reached
is skipped for ``retry_s`` (doubling up to RETRY_MAX_S), so requests do not each wait out the deadline,
and the idle probes take it back when it answers again.

The wire (wire.py): ``POST /member`` with a float32 batch, ``GET /ping``, ``POST /stop``, each carrying the
job's token, made by rank 0 and sent in the start-up collective.
"""

from __future__ import annotations

import hmac
import math
import os
import secrets
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import torch
from torch import Tensor

from npudist.comm.control import gather_objects
from npudist.httpserve import Front, Limits, Reply, Request
from npudist.httpserve.request import Head
from npudist.infer import wire
from npudist.infer.collective import world
from npudist.infer.combine import finish
from npudist.infer.ensemble import EnsembleError, EnsembleResult, EnsembleServer, EnsembleStats
from npudist.infer.wire import COMPUTE, SHAPE, TOKEN, MemberFailed, WireError, decode, encode
from npudist.runtime import network
from npudist.runtime.env import launcher_env

DEADLINE_S = 5.0
"""Default wait for the members' answers to one request, from when it is sent."""
RETRY_S, RETRY_MAX_S = 2.0, 30.0
"""An unreachable member is skipped for RETRY_S, doubling on each failure up to RETRY_MAX_S."""
PROBE_S = 2.0
"""Timeout of one idle probe (GET /ping) and of the stop message."""
MAX_MEMBER_BYTES = 64 * 1024 * 1024

__all__ = ["COMPUTE", "DEADLINE_S", "SHAPE", "TOKEN", "FanoutFront", "Member", "MemberEndpoint", "MemberFailed",
           "WireError", "decode", "encode", "member_address", "serve_member", "start"]


def member_address(host: str) -> str:
    """``auto``: the address this rank's peers reach it at (the interface that routes to MASTER_ADDR,
    loopback when the job is on one host); anything else is taken as given, except an unspecified
    address: the member would listen everywhere but tell the front 0.0.0.0, which is nowhere to connect to
    (every live member was left out as "connection refused")."""
    if network.is_unspecified(host) or host in ("", "0"):
        raise ValueError(f"--member-host {host!r} listens on every interface but gives the front no address to "
                         "connect to; use --member-host auto (this rank's address on the interface that routes "
                         "to the master) or this board's own address")
    if host != "auto":
        return host
    master = launcher_env(os.environ).master_addr or "127.0.0.1"
    try:
        if network.is_loopback(network.resolve(master)):
            return "127.0.0.1"
        return network.route_to(master).address
    except network.NetworkError as exc:
        raise ValueError(f"--member-host auto: no address found for this rank ({exc}); give this board's "
                         "address instead") from None


class MemberEndpoint:
    """This rank's member served to the front: one request at a time (the runner is not shared)."""

    def __init__(self, server: EnsembleServer, host: str, port: int = 0, limits: Limits | None = None) -> None:
        """Listen now (OSError when ``host`` cannot be bound); serve after ``start``."""
        self.server, self.token = server, ""
        self.front = Front(host, port, limits or Limits(max_body_bytes=MAX_MEMBER_BYTES, request_timeout_s=30.0),
                           name="npudist-member", admit=self._admit)
        self.stopped = threading.Event()
        """Set by the front's POST /stop."""
        self.last_heard = time.monotonic()
        self._run = threading.Lock()

    @property
    def address(self) -> str:
        return f"{self.front.host}:{self.front.port}"

    def start(self, token: str) -> MemberEndpoint:
        """Serve from now on, to requests that carry ``token`` (connections made since the endpoint
        was created wait in the listen queue until then)."""
        self.token = token
        self.last_heard = time.monotonic()
        self.front.start(self.handle)
        return self

    def _admit(self, head: Head) -> tuple[int, str] | None:
        """The token, checked from the head alone: a request without it is refused before its body (up to
        MAX_MEMBER_BYTES) is waited for or buffered."""
        if not self.token or not hmac.compare_digest(head.headers.get(TOKEN) or "", self.token):
            return 403, "this member answers its own job's front only (wrong or missing token)"
        return None

    def handle(self, request: Request) -> Reply:
        refusal = self._admit(request.head)
        if refusal:
            return wire.text_reply(*refusal)
        self.last_heard = time.monotonic()
        route = (request.head.method, request.head.path)
        if route == ("GET", "/ping"):
            return wire.text_reply(200, "ok")
        if route == ("POST", "/stop"):
            self.stopped.set()
            return wire.text_reply(200, "stopping")
        if route != ("POST", "/member"):
            return wire.text_reply(404, "POST /member, GET /ping or POST /stop")
        try:
            batch = decode(request.head.headers.get(SHAPE), request.body, self.server.input_features)
        except WireError as exc:
            return wire.text_reply(400, str(exc))
        with self._run:
            part, failure, compute = self.server.contribute(batch)
            self.server.stats.requests += 1
            self.server.stats.compute_seconds += compute
        if failure:
            return wire.text_reply(422, f"member failed: {failure}")
        shape, body = encode(part)
        return Reply(200, body, ((SHAPE, shape), (COMPUTE, f"{compute:.9f}"),
                                 ("Content-Type", "application/octet-stream")))

    def wait(self, orphan_s: float) -> bool:
        """Serve until the front says stop (True) or has not been heard from for ``orphan_s`` (False)."""
        while not self.stopped.wait(min(1.0, orphan_s)):
            if time.monotonic() - self.last_heard > orphan_s:
                return False
        return True

    def close(self) -> None:
        self.front.close(wait=True)


@dataclass
class Member:
    """A member as the front sees it: where it listens and whether it answered lately."""

    rank: int
    node: str
    host: str
    port: int
    retry_s: float = RETRY_S
    down_until: float = 0.0
    """Monotonic time before which requests skip it (0: up)."""
    failures: int = 0
    """Failures in a row (connection, timeout); the skip doubles with each."""
    last_error: str = ""

    @property
    def name(self) -> str:
        return f"rank {self.rank} on {self.node} ({self.host}:{self.port})"

    def skipped(self, now: float) -> bool:
        return now < self.down_until

    def lost(self, why: str, now: float) -> None:
        self.failures += 1
        self.last_error = why
        self.down_until = now + min(RETRY_MAX_S, self.retry_s * 2 ** (self.failures - 1))

    def back(self) -> None:
        self.failures, self.down_until, self.last_error = 0, 0.0, ""


@dataclass
class FanoutFront:
    """Rank 0's side: the same ``request``/``idle``/``stop`` the HTTP front drives on an EnsembleServer."""

    server: EnsembleServer
    members: list[Member]
    """Every other rank's member (rank 0's own runs here, in process)."""
    token: str
    deadline_s: float = DEADLINE_S
    min_members: int | None = None
    """Answers needed for a reply; None: half the ensemble, rounded up."""
    _pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        if not math.isfinite(self.deadline_s) or self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be a finite number of seconds above 0, got {self.deadline_s}")
        need = self.needed
        if not 1 <= need <= self.expected:
            raise ValueError(f"min_members={self.min_members}: give 1 to {self.expected}, the ensemble's size")
        # Twice the members: a request's late calls may still run (bounded by the deadline) as the next starts.
        self._pool = ThreadPoolExecutor(max(2, 2 * len(self.members)), thread_name_prefix="npudist-fanout")
        self.stats.members_expected = self.stats.members_answering = self.expected

    @property
    def expected(self) -> int:
        return len(self.members) + 1

    @property
    def needed(self) -> int:
        return self.min_members if self.min_members is not None else math.ceil(self.expected / 2)

    @property
    def stats(self) -> EnsembleStats:
        return self.server.stats

    @property
    def combine(self) -> str:
        return self.server.combine

    @property
    def input_features(self) -> int | None:
        return self.server.input_features

    @property
    def max_batch(self) -> int:
        return self.server.max_batch

    @property
    def rank(self) -> int:
        return 0

    def request(self, batch: Tensor) -> EnsembleResult:
        """Ask every member not being skipped, this rank's own member meanwhile; combine what came back."""
        start = time.monotonic()
        shape, body = encode(batch.float())
        skipped = [m for m in self.members if m.skipped(start)]
        asked = [m for m in self.members if not m.skipped(start)]
        calls = {self._pool.submit(wire.call, (m.host, m.port), "POST", "/member", token=self.token,
                                      timeout=self.deadline_s, body=body, shape=shape): m
                 for m in asked}
        part, failure, compute = self.server.contribute(batch)
        waited = time.perf_counter()
        wait(calls, timeout=max(0.0, start + self.deadline_s - time.monotonic()))
        aggregate = time.perf_counter() - waited
        now = time.monotonic()
        parts, seconds = ([part], [compute]) if not failure else ([], [])
        missing = [f"rank 0 (this front): {failure}"] if failure else []
        missing += [f"{m.name}: skipped for {m.down_until - now:.1f} s more after {m.failures} failure(s): "
                    f"{m.last_error}" for m in skipped]
        for call, m in calls.items():
            why = self._collect(call, m, now, batch.shape[0], parts, seconds)
            if why:
                missing.append(f"{m.name}: {why}")
        self.stats.requests += 1
        self.stats.members_answering = len(parts)
        if len(parts) < self.needed:
            self.stats.errors += 1
            error = EnsembleError(f"only {len(parts)} of {self.expected} ensemble members answered "
                                  f"(at least {self.needed} needed): " + "; ".join(missing))
            error.status = 503
            raise error
        labels, scores = finish(torch.stack(parts).sum(0), len(parts), self.combine)
        self.stats.degraded += bool(missing)
        self.stats.compute_seconds += compute
        self.stats.aggregate_seconds += aggregate
        return EnsembleResult(labels, scores, len(parts), compute, sum(seconds) / len(parts), aggregate,
                              missing=tuple(missing))

    def _collect(self, call: Future, m: Member, now: float, rows: int, parts: list[Tensor],
                 seconds: list[float]) -> str:
        """Add ``m``'s answer to ``parts``; or the reason it is left out (and skip it a while when unreachable)."""
        if not call.done():
            call.cancel()
            m.lost(f"no answer within {self.deadline_s:g} s", now)
            return m.last_error
        exc = call.exception()
        if isinstance(exc, MemberFailed):
            return str(exc)
        if exc is not None:
            m.lost(wire.why(exc), now)
            return m.last_error
        data, headers = call.result()
        try:
            part = decode(headers.get(SHAPE), data, self.server.num_classes)
            if part.shape[0] != rows:
                raise WireError(f"{part.shape[0]} rows for a batch of {rows}")
        except WireError as exc:
            return f"answer unusable: {exc}"
        m.back()
        parts.append(part)
        seconds.append(float(headers.get(COMPUTE) or 0.0))
        return ""

    def idle(self) -> None:
        """Probe every member (GET /ping): takes back those that answer, marks lost those that do not, and
        keeps the members' orphan timers from running out while no request comes."""
        now = time.monotonic()
        due = [m for m in self.members if not m.skipped(now)]
        calls = {self._pool.submit(wire.call, (m.host, m.port), "GET", "/ping", token=self.token, timeout=PROBE_S): m
                 for m in due}
        wait(calls, timeout=PROBE_S + 1.0)
        now = time.monotonic()
        for call, m in calls.items():
            exc = call.exception() if call.done() else TimeoutError()
            if exc is None:
                m.back()
            else:
                m.lost(wire.why(exc), now)
        self.stats.members_answering = 1 + sum(1 for m in self.members if not m.skipped(now))

    def stop(self) -> None:
        """Tell every member to stop (those gone are not waited for beyond PROBE_S), then end the pool."""
        calls = [self._pool.submit(wire.call, (m.host, m.port), "POST", "/stop", token=self.token, timeout=PROBE_S)
                 for m in self.members]
        wait(calls, timeout=PROBE_S + 1.0)
        self._pool.shutdown(wait=False, cancel_futures=True)


def start(server: EnsembleServer, member_host: str = "127.0.0.1", *, deadline_s: float = DEADLINE_S,
          min_members: int | None = None) -> tuple[MemberEndpoint | None, FanoutFront | None]:
    """Collective, every rank: start this rank's member endpoint (not on rank 0, whose member runs in the
    front) and exchange addresses. Returns (endpoint, None) on other ranks, (None, front) on rank 0.

    Raises ValueError on every rank, none left waiting, when a rank could not bind its member's
    address, when a member on another node listens on loopback (the front could never reach it), or for a
    deadline or ``min_members`` the front could not keep.
    """
    rank = world()[0]
    token = secrets.token_hex(16) if rank == 0 else ""
    endpoint, problem = None, ""
    try:  # a rank that cannot serve still takes part in the exchange, so that every rank raises, none hangs
        host = member_address(member_host)
        if rank != 0:
            endpoint = MemberEndpoint(server, host)
        address = endpoint.address if endpoint else f"{host}:0"
    except (OSError, ValueError) as exc:
        problem, address = f"{type(exc).__name__}: {exc}", ""
    try:
        rows: list[tuple[str, str, str]] = gather_objects((socket.gethostname(), address, token))
        unable = [f"rank {r} on {n}" for r, (n, a, _) in enumerate(rows) if not a]
        if unable:
            why = problem or "the error on that rank says why"
            raise ValueError(f"the fan-out front cannot start: no member address on {', '.join(unable)} "
                             f"(member host {member_host!r}; {why})")
        bad_deadline = not math.isfinite(deadline_s) or deadline_s <= 0  # inf and nan pass a `<= 0` test
        if bad_deadline or (min_members is not None and not 1 <= min_members <= len(rows)):
            raise ValueError(f"deadline {deadline_s} s and min_members {min_members}: give a finite deadline above 0 "
                             f"and 1 to {len(rows)} members (the ensemble's size)")
        members = []
        for r, (n, a, _) in enumerate(rows[1:], 1):
            h, _, p = a.rpartition(":")
            if network.is_loopback(h) and n != rows[0][0]:
                raise ValueError(f"rank {r} on {n} serves its member on {h}, which the front on {rows[0][0]} "
                                 "cannot reach; start every rank with --member-host auto (the address its "
                                 "process group uses) or with that board's own address")
            members.append(Member(r, n, h, int(p)))
    except BaseException:
        if endpoint is not None:
            endpoint.close()
        raise
    if endpoint is not None:
        return endpoint.start(rows[0][2]), None
    return None, FanoutFront(server, members, token, deadline_s, min_members)


def serve_member(endpoint: MemberEndpoint, orphan_s: float) -> bool:
    """Other ranks: serve until the front says stop (True) or is silent for ``orphan_s`` (False)."""
    try:
        return endpoint.wait(orphan_s)
    finally:
        endpoint.close()

